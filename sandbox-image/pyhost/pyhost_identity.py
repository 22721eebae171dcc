"""A Python server's own identity (the Python tool host, the jedi language server); see
sandbox_agent/server_identity.py for the design.

The agent starts the server with real uid = the server's own uid and effective uid = the tool user.
execve copied the effective uid into the saved uid, and a process may signal another whose real or saved
uid equals its own real or effective uid: until the saved uid is the server's uid again, any tool process
could SIGKILL or SIGSTOP it. ptrace and /proc/PID/mem already fail (the exec changed identity, so the
process is not dumpable, and its real uid is not the caller's); the prctl keeps it so explicitly.

On gVisor, whose execve resets the effective uid to the real one, the agent starts the server as root with
CAP_SETUID alone and the two uids in AGENT_SERVER_UIDS ("S:T"); `_take_server_uids` takes them with
setresuid(S, T, S), which drops the capability and makes the process non-dumpable, and the rest is as on runc.
"""

from __future__ import annotations

import ctypes
import os

PR_SET_DUMPABLE = 4
SERVER_UIDS_ENV = "AGENT_SERVER_UIDS"
ROOT_STARTED = False
"""Whether the server took its uids itself (gVisor): then an exec keeps no split identity, so a child must be
the tool user's before its exec (pyhost_harden)."""


def _take_server_uids() -> None:
    global ROOT_STARTED
    given = os.environ.pop(SERVER_UIDS_ENV, None)  # not for the server's children
    # Started with its uids already (runc), or a test run of the agent without a tool user (as root or not).
    # A root server the agent meant to separate but that got no uids stays root: verify_server refuses it.
    if os.getuid() != 0 or given is None:
        return
    server, sep, tool = given.partition(":")
    if not (sep and server.isdigit() and tool.isdigit()):
        raise SystemExit(f'{SERVER_UIDS_ENV} is not "server:tool"')
    if int(server) == 0 or int(tool) == 0:
        raise SystemExit(f"{SERVER_UIDS_ENV} names root")
    os.setresuid(int(server), int(tool), int(server))  # every thread (glibc); the agent checks each task
    ROOT_STARTED = True


def protect() -> int | None:
    """Restores the saved uid; the tool user's uid, or None when there is no separate identity (test runs)."""
    _take_server_uids()
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
