"""The agent's `Runner`: filesystem work in threads that carry the tool user's filesystem identity.

Linux keeps the filesystem uid/gid per thread, so a small pool of threads that each called
setfsuid/setfsgid once performs every open, stat and write exactly as the tool user would: files
it creates belong to the tool user, and whatever the tool user may not read (the agent's /proc
entries, the socket directory) stays out of reach, symlinks included. Programs (rg, ...) run
through `Execution`, which switches the real uid.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sandbox_agent.errors import AgentError
from sandbox_agent.process import Chunk, ExecSpec, Execution, Identity
from sandbox_agent.server_identity import exec_keeps_split_uid, server_argv, server_uid
from sandbox_agent.tools.base import ProcessResult

T = TypeVar("T")
IO_THREADS = 4
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@functools.cache
def _libc() -> ctypes.CDLL:
    # The process's own symbols, libc's among them: ctypes.util.find_library would import shutil, tempfile and
    # subprocess (0.2 MiB of every idle agent) and run `ldconfig -p` to find the same library.
    return ctypes.CDLL(None, use_errno=True)


_SETRES = {"x86_64": (117, 119), "aarch64": (147, 149)}
"""The raw setresuid and setresgid call numbers: unlike glibc's wrappers they change this thread only."""


@functools.cache
def _has_fsuid() -> bool:
    """False under gVisor as Debian ships it (runsc 2022), whose kernel answers setfsuid with ENOSYS."""
    return bool(_libc().setfsuid(-1) != -1)


def _take_identity(uid: int, gid: int) -> tuple[int, int]:
    """Sets this thread's filesystem uid and gid; returns the previous ones (the calls return them).

    Without setfsuid the thread's effective ids are switched instead (the filesystem ids follow them): its
    real and saved uid stay 0, so it can switch back, and no tool process may signal or trace it."""
    libc = _libc()
    if _has_fsuid():
        own_gid = libc.setfsgid(gid)
        own_uid = libc.setfsuid(uid)
        return own_uid, own_gid
    own_uid, own_gid = os.geteuid(), os.getegid()
    set_uid, set_gid = _SETRES[os.uname().machine]
    # The gid while still (or once again) uid 0: a thread that is the tool user may not change it.
    steps = [(set_gid, gid), (set_uid, uid)] if own_uid == 0 else [(set_uid, uid), (set_gid, gid)]
    for number, value in steps:
        libc.syscall(number, -1, value, -1)
    return own_uid, own_gid


def _holds_identity(uid: int, gid: int) -> bool:
    libc = _libc()
    if not _has_fsuid():
        return os.geteuid() == uid and os.getegid() == gid
    # Asked with an invalid id, each call changes nothing and reports the current value.
    return bool(libc.setfsuid(-1) == uid and libc.setfsgid(-1) == gid)


def _become_tool_user(uid: int, gid: int) -> None:
    _take_identity(uid, gid)
    if not _holds_identity(uid, gid):
        raise AgentError(f"could not take the tool user's filesystem identity ({uid}:{gid})")


def _as_tool_user(uid: int, gid: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on this thread with the tool user's filesystem identity, then the thread's own again.

    setfsuid/setfsgid act on the calling thread only (the raw calls, not glibc's all-threads setuid), so
    the agent's other threads keep theirs; on the event loop's thread nothing else runs until `fn` returns.
    """
    own = _take_identity(uid, gid)
    try:
        if not _holds_identity(uid, gid):
            raise AgentError(f"could not take the tool user's filesystem identity ({uid}:{gid})")
        return fn(*args)
    finally:
        _take_identity(*own)
        if not _holds_identity(*own):
            # Never go on serving with the tool user's identity on the agent's own thread.
            os._exit(70)


class ToolRunner:
    def __init__(self, identity: Identity, env: dict[str, str], buffer_limit: int = 4 * 1024 * 1024) -> None:
        self._identity = identity
        self._env = env
        self._buffer_limit = buffer_limit
        initializer: Callable[..., object] | None = None
        initargs: tuple[Any, ...] = ()
        if identity.uid is not None:
            gid = identity.gid if identity.gid is not None else identity.uid
            initializer, initargs = _become_tool_user, (identity.uid, gid)
        self._pool = ThreadPoolExecutor(IO_THREADS, "tool-io", initializer=initializer, initargs=initargs)

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def io_now(self, fn: Callable[..., T], *args: Any) -> T:
        if self._identity.uid is None:
            return fn(*args)
        gid = self._identity.gid if self._identity.gid is not None else self._identity.uid
        return _as_tool_user(self._identity.uid, gid, fn, *args)

    def _program(self, name: str) -> str:
        return name if "/" in name else _find_program(name, self._env.get("PATH", DEFAULT_PATH))

    async def run(self, argv: list[str], *, cwd: str, abort: asyncio.Event | None = None) -> ProcessResult:
        argv = [self._program(argv[0]), *argv[1:]] if argv else argv
        spec = ExecSpec(argv=argv, env=dict(self._env), cwd=cwd, timeout_s=None, stdin=False,
                        kill_grace_s=0.2, merge_stderr=False)
        execution = await Execution.start(spec, self._identity, self._buffer_limit)
        out, err = bytearray(), bytearray()
        watcher = asyncio.ensure_future(_stop_on(abort, execution)) if abort is not None else None
        try:
            async for item in execution.events():
                if isinstance(item, Chunk):
                    (out if item.stream == "stdout" else err).extend(item.data)
                else:
                    return ProcessResult(item.exit_code, bytes(out), bytes(err))
        finally:
            if watcher is not None:
                watcher.cancel()
            if not execution.finished:
                execution.stop(reason="cancelled")
        raise AgentError("the program ended without an exit status")

    async def start(self, argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float | None,
                    merge_stderr: bool, stdin: bool = False) -> Execution:
        """A long-lived or streamed process; `stdin=True` keeps a pipe to it (tool hosts, servers)."""
        argv = [self._program(argv[0]), *argv[1:]] if argv else argv
        spec = ExecSpec(argv=argv, env=self._env | env, cwd=cwd, timeout_s=timeout_s, stdin=stdin,
                        kill_grace_s=0.2, merge_stderr=merge_stderr)
        return await Execution.start(spec, self._identity, self._buffer_limit)

    async def start_server(self, argv: list[str], *, cwd: str, env: dict[str, str], kind: int,
                           guards_itself: bool = False) -> Execution:
        """A long-lived server (a tool host) with stdin, under the real uid of its `kind` (server_identity's
        BUN_SERVER, ...) and the tool user's effective uid; unseparated when the agent has no tool user (a test run)."""
        if self._identity.uid is None:
            return await self.start(argv, cwd=cwd, env=env, timeout_s=None, merge_stderr=False, stdin=True)
        uid = self._identity.uid
        gid = self._identity.gid if self._identity.gid is not None else uid
        split = await exec_keeps_split_uid(server_uid(uid, kind), uid, self._buffer_limit)
        argv = server_argv([self._program(argv[0]), *argv[1:]], server_uid(uid, kind), uid, gid, split_exec=split,
                           guards_itself=guards_itself)
        spec = ExecSpec(argv=argv, env=self._env | env, cwd=cwd, timeout_s=None, stdin=True, kill_grace_s=0.2,
                        merge_stderr=False)
        # Started by the agent itself (the spawner runs as the tool user and cannot set another uid).
        return await Execution.start(spec, Identity(uid=None, gid=None), self._buffer_limit)

    def server_uid(self, kind: int) -> int:
        """The real uid `start_server` gives a server of `kind` (only meaningful when `separates_servers`)."""
        return server_uid(self._identity.uid if self._identity.uid is not None else os.getuid(), kind)

    @property
    def separates_servers(self) -> bool:
        """Whether `start_server` gives servers an identity of their own."""
        return self._identity.uid is not None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _stop_on(abort: asyncio.Event, execution: Execution) -> None:
    await abort.wait()
    execution.stop(reason="aborted")


@functools.cache
def _find_program(name: str, path: str) -> str:
    """A bare program name looked up in the tool PATH, then beside this Python (a venv's rg); once."""
    import shutil  # only here: shutil (with bz2 and lzma) is 0.3 MiB of every idle agent

    return shutil.which(name, path=path) or shutil.which(name, path=os.path.dirname(sys.executable)) or name


def default_env(home: str) -> dict[str, str]:
    return {"PATH": DEFAULT_PATH, "HOME": home, "LANG": "C.UTF-8", "USER": "tool", "TMPDIR": "/tmp", "TERM": "dumb",
            "SHELL": "/bin/bash"}


def local_runner() -> ToolRunner:
    """A runner for tests outside a container: the current user, the current PATH."""
    env = default_env(os.environ.get("HOME", "/tmp"))
    env["PATH"] = os.environ.get("PATH", DEFAULT_PATH)
    return ToolRunner(Identity(uid=None, gid=None), env)
