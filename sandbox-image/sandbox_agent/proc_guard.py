"""No tool process may write under /proc: a Landlock domain that the spawner helper and each tool host enter.

Why: the OOM killer takes the process with the highest badness (its memory plus `oom_score_adj` thousandths of
the container's limit). Tool processes start at 1000 (the helper's value; the tool hosts 500) and the agent at
0, so that a hog loses. But the kernel lets any process lower its own value down to its `oom_score_adj_min`,
and that floor is raised only by a writer holding CAP_SYS_RESOURCE; otherwise it stays at the inherited 0.
Thirty small tool processes that wrote 0 back, each smaller than the agent, made the agent (the largest at 0)
the victim: the container ended and the session was lost.

Pinning the floor needs CAP_SYS_RESOURCE for the agent, which an engine can only give when its host has it:
on the build machine (a VM whose bounding set lacks it) runc refuses such a container ("unable to apply caps").
Landlock needs no privilege at all, only no_new_privs (every sandbox has it) and a kernel with Landlock
(5.19 on, enabled in the LSM list): the domain handles opening a file for writing (and linking or renaming into
another directory, which a domain refuses unless handled) and grants both beneath every top-level entry of `/`
except `/proc`. So a write-open of `/proc/self/oom_score_adj` (or
`oom_adj`, or another process's) fails with EACCES; everything else stays as it was: the root filesystem is
read-only anyway, and `/dev/stdout`, `/dev/fd/N` and process substitution still work (their magic links
resolve to the pipe or file itself, which Landlock judges by that object). A domain cannot be left, and every
child inherits it across fork and exec. The agent itself stays outside: it writes the tool hosts' values.

Where Landlock is missing (ENOSYS: gVisor, which keeps no OOM killer per process anyway; an old kernel) or
no_new_privs is not set (a host run of the agent), nothing is restricted and `restrict_proc_writes` says so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_RULE_PATH_BENEATH = 1
_ACCESS_FS_WRITE_FILE = 1 << 1
_ACCESS_FS_REFER = 1 << 13
"""Linking or renaming into another directory. Any Landlock domain refuses it (EXDEV) unless the ruleset handles it
and a rule grants it, so it is handled and granted wherever writes are: `mv a d/` and `ln a d/b` keep working."""
_CREATE_RULESET_VERSION = 1 << 0
_PR_GET_NO_NEW_PRIVS = 39
GUARDED = "/proc"


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *args: object) -> int:
    result: int = _libc.syscall(number, *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def restrict_proc_writes() -> bool:
    """Enters the domain (this process and all it starts from now on); False when this kernel cannot."""
    if _libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        return False  # a host run: Landlock would need no_new_privs, which the agent does not impose there
    try:
        abi = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise
    if abi < 2:
        return False  # Landlock's first version refuses every link or rename into another directory
    attr = _RulesetAttr(_ACCESS_FS_WRITE_FILE | _ACCESS_FS_REFER)
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                       ctypes.c_uint32(0))
    try:
        for name in os.listdir("/"):
            if "/" + name != GUARDED:
                _allow_writes_beneath("/" + name, ruleset)
        _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return True


def _allow_writes_beneath(path: str, ruleset: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)  # a top-level symlink (/bin) gives its target's rule
    except OSError:
        return  # gone, or a dangling link: nothing to write there
    try:
        directory = stat.S_ISDIR(os.fstat(fd).st_mode)  # a file's rule may hold file rights only
        rule = _PathBeneathAttr(_ACCESS_FS_WRITE_FILE | (_ACCESS_FS_REFER if directory else 0), fd)
        try:  # (not contextlib.suppress: the spawner helper imports this module, and contextlib costs it memory)
            _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                     ctypes.c_uint32(0))
        except OSError:
            pass  # an entry Landlock cannot hold a rule for stays unwritable
    finally:
        os.close(fd)


def exec_restricted(argv: list[str] | None = None) -> None:
    """`python3 -m sandbox_agent.proc_guard PROGRAM ARGS...`: enters the domain, then becomes PROGRAM (a tool host's
    first step, before its uid switch; see server_identity.server_argv)."""
    args = sys.argv[1:] if argv is None else argv
    restrict_proc_writes()
    os.execv(args[0], args)


if __name__ == "__main__":
    exec_restricted()
