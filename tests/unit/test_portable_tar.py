"""What a snapshot or a fork leaves out of a workspace tar: only what no new session would take."""

from __future__ import annotations

import io
import tarfile

from controlplane.core.sessions.portable_tar import portable


def _tar(*members: tuple[str, bytes, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            info.mode = 0o640 if kind == tarfile.REGTYPE else 0o755
            data = b"data of " + name.encode() if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _listing(data: bytes) -> list[tuple[str, str, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m.name, m.linkname, m.mode) for m in tar]


def test_a_tree_with_nothing_to_leave_out_is_used_as_it_came() -> None:
    data = _tar(("d", tarfile.DIRTYPE, ""), ("d/f", tarfile.REGTYPE, ""), ("d/up", tarfile.SYMTYPE, "../d/f"),
                ("d/gone", tarfile.SYMTYPE, "missing"), ("hard", tarfile.LNKTYPE, "d/f"))
    made = portable(data)
    assert made.tar is data
    assert made.dropped == []


def test_links_out_of_the_workspace_and_fifos_are_left_out_by_name() -> None:
    data = _tar(("d", tarfile.DIRTYPE, ""), ("d/f", tarfile.REGTYPE, ""), ("abs", tarfile.SYMTYPE, "/etc/passwd"),
                ("d/out", tarfile.SYMTYPE, "../../x"), ("pipe", tarfile.FIFOTYPE, ""),
                ("d/in", tarfile.SYMTYPE, "../d/f"), ("dev", tarfile.CHRTYPE, ""))
    made = portable(data)
    assert _listing(made.tar) == [("d", "", 0o755), ("d/f", "", 0o640), ("d/in", "../d/f", 0o755)]
    with tarfile.open(fileobj=io.BytesIO(made.tar)) as tar:
        body = tar.extractfile("d/f")
        assert body is not None
        assert body.read() == b"data of d/f"
    assert [d.split(":")[0] for d in made.dropped] == ["abs", "d/out", "pipe", "dev"]
    assert "outside the workspace" in made.dropped[0]
