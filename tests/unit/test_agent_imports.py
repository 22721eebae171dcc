"""What an idle agent has imported: every module stays in memory for the sandbox's life, so a module only a rare
RPC needs (StartNetwork, a workspace download, a plugin named by a file URL) is imported where that RPC runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sandbox_agent

AGENT_ROOT = Path(sandbox_agent.__file__).resolve().parent.parent
RARE = {"tarfile", "urllib.parse", "ipaddress", "tempfile", "platform", "ctypes.util", "shutil", "bz2", "lzma",
        "secrets", "random", "_ssl"}
"""`_ssl`: the agent's process speaks no TLS (no_tls.py); shutil only where `which` and `rmtree` run."""


def agent_modules() -> set[str]:
    """The modules of a fresh interpreter once it imported what `python3 -m sandbox_agent` imports before serving."""
    code = (f"import sys; sys.path.insert(0, {str(AGENT_ROOT)!r}); "
            "import sandbox_agent.__main__, sandbox_agent.serving; print(' '.join(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    return set(done.stdout.split())


def test_an_idle_agent_has_not_imported_what_only_rare_rpcs_need() -> None:
    loaded = agent_modules()
    assert "sandbox_agent.server" in loaded
    assert loaded & RARE == set()


def test_the_rare_rpcs_modules_still_import_what_they_use(tmp_path: Path) -> None:
    """The moved imports are reached: each function that needs one of them runs its import (a typo would fail
    only on the rare path)."""
    from sandbox_agent import egress_forwarder, fileops, syscall_filter
    from sandbox_agent.custom import discovery

    assert discovery._url_path("file:///a%20b/tool.ts") == "/a b/tool.ts"
    info = fileops._info("d", Path("/").stat())
    assert info.isdir()
    assert syscall_filter.program(["io_setup"], os.uname().machine)
    from sandbox_agent.custom import manager, snapshot
    from sandbox_agent.tools import runner

    assert runner._find_program("sh", "/usr/bin:/bin") in ("/usr/bin/sh", "/bin/sh")
    manager.find_bun()  # None or a path: reaching shutil.which is the point
    (tmp_path / "old-snapshot" / "d").mkdir(parents=True)
    snapshot.remove(str(tmp_path / "old-snapshot"))
    assert not (tmp_path / "old-snapshot").exists()
    (tmp_path / "cas.pem").write_bytes(b"SYSTEM")
    bundle = egress_forwarder.write_ca_bundle(b"SESSION", str(tmp_path), str(tmp_path / "cas.pem"))
    assert Path(bundle).read_bytes() == b"SYSTEM\nSESSION"
