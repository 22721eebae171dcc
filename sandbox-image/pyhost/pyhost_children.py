"""Which call started which child process, in the Python tool host.

A call that ignores abort is abandoned by the driver rather than taking the host down with it, so the
host itself ends the children such a call left running (before, the host restart killed them). Every
`subprocess.Popen` (and so `os.popen` and asyncio's subprocesses) records its pid in the set of the call
whose context started it: the set is a context variable, which tasks and `asyncio.to_thread` copy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from contextvars import ContextVar
from typing import Any

CHILDREN: ContextVar[set[int] | None] = ContextVar("pyhost_children", default=None)


def install() -> None:
    popen_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        popen_init(self, *args, **kwargs)
        children = CHILDREN.get()
        if children is not None:
            children.add(self.pid)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]


def kill_all(children: set[int]) -> None:
    """SIGKILL to every recorded child still there (an exited one not yet reaped is left alone)."""
    for pid in children:
        with contextlib.suppress(OSError):
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                os.kill(pid, signal.SIGKILL)
    children.clear()


install()
