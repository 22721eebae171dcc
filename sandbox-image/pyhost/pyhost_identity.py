"""A Python server's own identity (the Python tool host, the jedi language server); see
sandbox_agent/server_identity.py for the design.

The agent starts the server with real uid = the server's own uid and effective uid = the tool user.
execve copied the effective uid into the saved uid, and a process may signal another whose real or saved
uid equals its own real or effective uid: until the saved uid is the server's uid again, any tool process
could SIGKILL or SIGSTOP it. ptrace and /proc/PID/mem already fail (the exec changed identity, so the
process is not dumpable, and its real uid is not the caller's); the prctl keeps it so explicitly.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_DUMPABLE = 4


def protect() -> int | None:
    """Restores the saved uid; the tool user's uid, or None when there is no separate identity (test runs)."""
    ruid, euid, _ = os.getresuid()
    if ruid == euid:
        return None
    os.setresuid(-1, -1, ruid)  # glibc applies it to every thread; the agent checks each task afterwards
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    # Code here is the tool user for every purpose but signals and ptrace: it says so, as it did before.
    os.getuid = os.geteuid
    return euid
