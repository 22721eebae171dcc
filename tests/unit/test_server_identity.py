"""A server's start chain (server_identity.server_argv): proc_guard's domain is entered either by GUARD's
interpreter at the chain's head or, for a server that enters it as its own first step (the Python tool host), by
the server itself; the Python host does enter it when it starts (pyhost_harden)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from sandbox_agent import server_identity
from sandbox_agent.custom import host
from sandbox_agent.server_identity import GUARD, PY_SERVER, server_argv

PYHOST = Path(server_identity.__file__).resolve().parent.parent / "pyhost"


def test_a_server_that_guards_itself_starts_without_guards_interpreter() -> None:
    for split in (True, False):
        guarded = server_argv(["/usr/bin/python3", "host.py"], 1002, 1000, 1000, split_exec=split)
        itself = server_argv(["/usr/bin/python3", "host.py"], 1002, 1000, 1000, split_exec=split, guards_itself=True)
        assert guarded[:len(GUARD)] == GUARD
        assert itself == guarded[len(GUARD):]


class _Runner:
    separates_servers = False

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def start_server(self, argv: list[str], **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return object()


async def test_the_python_host_is_started_as_a_server_that_guards_itself() -> None:
    runner = _Runner()
    launch = host.python_launcher(runner, "/usr/bin/python3", "host.py", "/", {})  # type: ignore[arg-type]
    await launch()
    assert runner.calls[0]["kind"] == PY_SERVER
    assert runner.calls[0]["guards_itself"] is True


def test_the_python_hosts_hardening_enters_the_domain_that_refuses_proc_writes() -> None:
    # A child with no_new_privs (as every sandbox process has) imports the host's hardening, then tries what a tool
    # would do to make the agent the OOM killer's victim: lower its own score.
    code = (
        "import ctypes, sys\n"
        "ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)\n"
        f"sys.path.insert(0, {str(PYHOST)!r})\n"
        "import pyhost_harden\n"
        "try:\n"
        "    open('/proc/self/oom_score_adj', 'w').write('0')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "else:\n"
        "    print('written')\n"
    )
    done = subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "refused", done.stderr
