"""The engine's tar of a workspace directory renamed as the agent's download names it
(controlplane.sandbox.workspace_salvage.relative): what a FAILED session's kept workspace restores from."""

from __future__ import annotations

import io
import tarfile

from controlplane.sandbox.workspace_salvage import relative


def _engine_tar(prefix: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        root = tarfile.TarInfo(prefix.rstrip("/") or ".")
        root.type, root.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(root)
        for name, data, mode in (("src/", b"", 0o750), ("src/main.py", b"print(1)\n", 0o640)):
            info = tarfile.TarInfo(prefix + name.rstrip("/"))
            info.mode = mode
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(prefix + "same.py")
        link.type, link.linkname = tarfile.LNKTYPE, prefix + "src/main.py"
        tar.addfile(link)
        sym = tarfile.TarInfo(prefix + "link")
        sym.type, sym.linkname = tarfile.SYMTYPE, "src/main.py"
        tar.addfile(sym)
    return out.getvalue()


def test_names_lose_the_copied_directory_and_keep_modes_links_and_bytes() -> None:
    for prefix in ("workspace/", "./"):
        with tarfile.open(fileobj=io.BytesIO(relative(_engine_tar(prefix)))) as tar:
            members = {m.name: m for m in tar.getmembers()}
            assert sorted(members) == ["link", "same.py", "src", "src/main.py"]
            assert members["src"].mode == 0o750
            assert members["src/main.py"].mode == 0o640
            assert members["same.py"].linkname == "src/main.py"
            assert members["link"].linkname == "src/main.py"
            main = tar.extractfile("src/main.py")
            assert main is not None
            assert main.read() == b"print(1)\n"
