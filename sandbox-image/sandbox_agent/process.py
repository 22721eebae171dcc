"""One command run as the tool user: output streamed in order, the whole process group stopped.

Completion is the exit of the command itself (seen through a pidfd), not the end of its output
pipes: a backgrounded child that keeps stdout open must not hang the call. After the exit the
pipes are drained briefly, then closed. Commands of another uid are started by the spawner helper
(see `spawner`): a uid switch in Popen would fork the whole agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sandbox_agent import spawner
from sandbox_agent.errors import SpawnError

DRAIN_GRACE_S = 0.02
"""How long output pipes may stay open after the command exited (someone else holds them)."""
GROUP_POLL_S = 0.005
KILL_BOUND_S = 2.0
"""How long a stop keeps killing a group that still has members (a fork bomb) before giving up."""
FREEZE_ROUNDS = 20
"""Stop-and-scan rounds before the kill; each catches the children forked since the previous one."""
READ_SIZE = 64 * 1024
UMASK = 0o022


@dataclass(frozen=True)
class Identity:
    """Who tool processes run as; `uid=None` keeps the agent's own user (unprivileged test runs)."""

    uid: int | None
    gid: int | None
    via_spawner: bool = field(default=True, kw_only=True)
    """Start processes of another uid through the spawner helper; False: Popen's own uid switch."""


@dataclass(frozen=True)
class ExecSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    timeout_s: float | None
    stdin: bool
    kill_grace_s: float
    merge_stderr: bool


@dataclass(frozen=True)
class Chunk:
    stream: str  # "stdout" | "stderr"
    data: bytes


@dataclass(frozen=True)
class Exit:
    exit_code: int
    signal: int
    timed_out: bool
    aborted: bool
    duration_ms: int
    abort_reason: str


@dataclass(frozen=True)
class _Launched:
    pid: int
    pidfd: int
    """Readable once the command exited; owned by the Execution."""
    stdin: int | None
    outputs: dict[int, str]
    """Read ends of the output pipes, by stream name."""
    exit_status: Callable[[], asyncio.Future[int | None]]
    """Called once the pidfd is readable: the returncode (None when it could not be learnt)."""


class Execution:
    """A running command. Start with `await Execution.start(...)`, then iterate `events()`."""

    def __init__(self, launched: _Launched, spec: ExecSpec, buffer_limit: int) -> None:
        self._spec = spec
        self._buffer_limit = buffer_limit
        self._loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        self.pid = launched.pid
        self._chunks: deque[Chunk] = deque()
        self._buffered = 0
        self._paused = False
        self._wakeup = asyncio.Event()
        self._exited = asyncio.Event()
        self._returncode: int | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._timed_out = False
        self._aborted = False
        self._abort_reason = ""
        self.finished = False
        self._stdin = launched.stdin
        self._stdin_writers = 0
        self._stdin_close_pending = False
        self._exit_status = launched.exit_status
        self._pipes: dict[int, str] = {}
        for fd, stream in launched.outputs.items():
            os.set_blocking(fd, False)
            self._pipes[fd] = stream
            self._loop.add_reader(fd, self._on_readable, fd)
        self._pidfd = launched.pidfd
        self._loop.add_reader(self._pidfd, self._on_exit)
        # An execution dropped before the end of its events must not keep its fds open.
        self._fds = {launched.pidfd, *launched.outputs} | ({launched.stdin} if launched.stdin is not None else set())
        weakref.finalize(self, _close_fds, self._fds)
        self._timer = (
            self._loop.call_later(spec.timeout_s, self._on_timeout) if spec.timeout_s else None
        )
        self._tree = _ProcessTree(launched.pid)

    @classmethod
    async def start(cls, spec: ExecSpec, identity: Identity, buffer_limit: int) -> Execution:
        if not spec.argv:
            raise SpawnError("nothing to run: the command is empty")
        if not os.path.isdir(spec.cwd):  # noqa: ASYNC240 - one stat on a local filesystem
            raise SpawnError(f"working directory {spec.cwd} does not exist")
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe() if not spec.merge_stderr else (None, None)
        stdin_r, stdin_w = os.pipe() if spec.stdin else (None, None)
        ours = [fd for fd in (stdout_r, stderr_r, stdin_w) if fd is not None]
        theirs = [fd for fd in (stdout_w, stderr_w, stdin_r) if fd is not None]
        outputs = {stdout_r: "stdout"} | ({stderr_r: "stderr"} if stderr_r is not None else {})
        try:
            if identity.uid is not None and identity.via_spawner:
                gid = identity.gid if identity.gid is not None else identity.uid
                helper = spawner.shared(identity.uid, gid)
                spawned = await helper.spawn(
                    spec.argv, spec.env, spec.cwd, umask=UMASK, stdout=stdout_w, stderr=stderr_w, stdin=stdin_r
                )
                launched = _Launched(
                    spawned.pid, spawned.pidfd, stdin_w, outputs, lambda: helper.exit_status(spawned)
                )
            else:
                launched = _popen(spec, identity, stdin_r, stdout_w, stderr_w, stdin_w, outputs)
        except BaseException as exc:
            _close_fds(ours)
            if isinstance(exc, OSError):
                raise _spawn_error(spec.argv[0], exc) from exc
            raise
        finally:
            _close_fds(theirs)
        return cls(launched, spec, buffer_limit)

    @staticmethod
    async def close_spawners() -> None:
        """Stops the spawner helpers (agent shutdown); commands still running are not touched."""
        await spawner.close_all()

    # -- output -----------------------------------------------------------------------------

    def _on_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe(fd)
        else:
            self._chunks.append(Chunk(self._pipes[fd], data))
            self._buffered += len(data)
            if self._buffered >= self._buffer_limit and not self._paused:
                self._paused = True
                for open_fd in self._pipes:
                    self._loop.remove_reader(open_fd)
        self._wakeup.set()

    def _close_pipe(self, fd: int) -> None:
        if fd not in self._pipes:
            return
        self._loop.remove_reader(fd)
        del self._pipes[fd]
        self._close(fd)

    def _take(self) -> Chunk:
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk.data)
        if self._paused and self._buffered <= self._buffer_limit // 2:
            self._paused = False
            for fd in self._pipes:
                self._loop.add_reader(fd, self._on_readable, fd)
        return chunk

    def _drain_now(self) -> None:
        """Reads what is already in the pipes without waiting, ignoring the pause."""
        for fd in list(self._pipes):
            while fd in self._pipes:
                try:
                    data = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    self._close_pipe(fd)
                    break
                self._chunks.append(Chunk(self._pipes[fd], data))
                self._buffered += len(data)

    async def events(self) -> AsyncIterator[Chunk | Exit]:
        """Output chunks in the order read, then exactly one `Exit`."""
        while True:
            while self._chunks:
                yield self._take()
            if self._exited.is_set():
                break
            self._wakeup.clear()
            await self._wakeup.wait()
        self._drain_now()
        if self._pipes:
            self._paused = False
            for fd in self._pipes:
                self._loop.add_reader(fd, self._on_readable, fd)
            deadline = self._loop.time() + DRAIN_GRACE_S
            while self._pipes and (remaining := deadline - self._loop.time()) > 0:
                while self._chunks:
                    yield self._take()
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
            for fd in list(self._pipes):
                self._close_pipe(fd)
        while self._chunks:
            yield self._take()
        self.close_stdin()  # the command is gone; a backgrounded child keeps no hold on our end
        if self._stop_task is not None:
            await asyncio.shield(self._stop_task)
        yield self._exit_event()
        self.finished = True

    def _exit_event(self) -> Exit:
        rc = self._returncode
        sig = -rc if rc is not None and rc < 0 else 0
        return Exit(
            # None: the spawner that reaped the command died before telling its status.
            exit_code=128 + sig if sig else -1 if rc is None else rc,
            signal=sig,
            timed_out=self._timed_out,
            aborted=self._aborted,
            duration_ms=int((time.monotonic() - self._started) * 1000),
            abort_reason=self._abort_reason,
        )

    # -- exit, stdin, stop --------------------------------------------------------------------

    def _on_exit(self) -> None:
        self._loop.remove_reader(self._pidfd)
        self._close(self._pidfd)
        status = self._exit_status()
        if status.done():
            self._on_status(status)
        else:
            status.add_done_callback(self._on_status)

    def _on_status(self, status: asyncio.Future[int | None]) -> None:
        self._returncode = status.result()
        if self._timer is not None:
            self._timer.cancel()
        self._exited.set()
        self._wakeup.set()

    async def write_stdin(self, data: bytes) -> None:
        fd = self._stdin
        if fd is None or self._stdin_close_pending:
            return
        # The fd stays open while a thread writes to it: its number must not be reused under the write.
        self._stdin_writers += 1
        try:
            await asyncio.to_thread(_write_all, fd, data)
        except OSError:
            self._stdin_close_pending = True
        finally:
            self._stdin_writers -= 1
        if self._stdin_close_pending:
            self.close_stdin()

    def close_stdin(self) -> None:
        self._stdin_close_pending = True
        if self._stdin is not None and self._stdin_writers == 0:
            self._close(self._stdin)
            self._stdin = None

    def _close(self, fd: int) -> None:
        self._fds.discard(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _on_timeout(self) -> None:
        self.stop(reason="timeout", timed_out=True)

    def stop(self, *, reason: str, timed_out: bool = False) -> asyncio.Task[None]:
        """SIGTERM to the whole group, SIGKILL after the grace period; idempotent."""
        if self._stop_task is None:
            if not self._exited.is_set():
                self._timed_out = timed_out
                self._aborted = not timed_out
                self._abort_reason = reason
            self._stop_task = self._loop.create_task(self._kill_group())
        return self._stop_task

    async def _kill_group(self) -> None:
        self.close_stdin()
        alive = self._signal_group(signal.SIGTERM)
        for pid in self._tree.members():  # children that left the group with setsid
            _signal(pid, signal.SIGTERM)
            alive = True
        if not alive:
            return
        if await self._group_gone_within(self._spec.kill_grace_s) and not self._tree.members():
            return
        await self._freeze_and_kill()

    async def _freeze_and_kill(self) -> None:
        """SIGKILLs the group and every process descended from it, until none is left or KILL_BOUND_S passed.

        A fork bomb keeps forking while it is being killed, and a child that called setsid() is no longer
        in the group: the tree is first stopped (a stopped process cannot fork, and its children stay
        linked to it by their parent pid) until a scan finds nobody new, then killed, then swept again.
        """
        deadline = self._loop.time() + KILL_BOUND_S
        stopped: set[int] = set()
        for _ in range(FREEZE_ROUNDS):
            self._signal_group(signal.SIGSTOP)
            members = self._tree.members()
            for pid in members - stopped:
                _signal(pid, signal.SIGSTOP)
            if members <= stopped:
                break
            stopped |= members
        # The stopped ones are killed by pid first: once their parent is dead they are re-parented to init
        # and a scan would no longer find them.
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
        while True:
            self._signal_group(signal.SIGKILL)
            members = self._tree.members()
            for pid in members:
                _signal(pid, signal.SIGKILL)
            if not members and not self._signal_group(0):
                return
            if self._loop.time() >= deadline:
                return
            await asyncio.sleep(GROUP_POLL_S)

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    async def _group_gone_within(self, seconds: float) -> bool:
        deadline = self._loop.time() + seconds
        while True:
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                return True
            if self._loop.time() >= deadline:
                return False
            await asyncio.sleep(GROUP_POLL_S)


class _ProcessTree:
    """The processes a command left: its group and session, and whatever descends from them by parent pid.

    Found by scanning /proc (the agent has no cgroup of its own per command). A process whose parent
    died before the scan (a double fork, `setsid -f`) is re-parented to init and cannot be found.
    """

    def __init__(self, leader: int) -> None:
        self._leader = leader
        self._leader_start = _start_time(leader)
        """Tells the leader from a later process that reused its pid (and so its group and session ids)."""

    def members(self) -> set[int]:
        table = _process_table()
        leader = table.get(self._leader)
        if leader is not None and self._leader_start is not None and leader[3] != self._leader_start:
            return set()
        found = {pid for pid, (_ppid, pgrp, sid, _start) in table.items()
                 if pgrp == self._leader or sid == self._leader}
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_rest) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = list(found)
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        found.discard(os.getpid())
        found.discard(1)
        return found


def _process_table() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (ppid, process group, session, start time) of every process visible in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            table[int(entry)] = fields
    return table


def _stat_fields(pid: int) -> tuple[int, int, int, int] | None:
    """(ppid, process group, session, start time), or None for a process that is gone or a zombie."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)  # os.open: a buffered open() costs far more in /proc
        try:
            text = os.read(fd, 1024)
        finally:
            os.close(fd)
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces and parentheses.
    rest = text[text.rfind(b")") + 2:].split()
    try:
        if rest[0] == b"Z":
            return None
        return int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19])
    except (IndexError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else fields[3]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _popen(
    spec: ExecSpec, identity: Identity, stdin: int | None, stdout: int, stderr: int | None, stdin_w: int | None,
    outputs: dict[int, str],
) -> _Launched:
    extra: dict[str, Any] = {}
    if identity.uid is not None:
        extra = {"user": identity.uid, "group": identity.gid, "extra_groups": []}
    proc = subprocess.Popen(
        spec.argv,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr if stderr is not None else subprocess.STDOUT,
        cwd=spec.cwd,
        env=spec.env,
        start_new_session=True,
        close_fds=True,
        umask=UMASK,
        **extra,
    )
    loop = asyncio.get_running_loop()

    def exit_status() -> asyncio.Future[int | None]:
        status: asyncio.Future[int | None] = loop.create_future()

        def poll() -> None:
            rc = proc.poll()
            if rc is None:  # the pidfd turns readable a moment before the zombie can be reaped
                loop.call_soon(poll)
            else:
                status.set_result(rc)

        poll()
        return status

    return _Launched(proc.pid, os.pidfd_open(proc.pid), stdin_w, outputs, exit_status)


def _spawn_error(program: str, exc: OSError) -> SpawnError:
    if exc.errno == errno.ENOENT:
        return SpawnError(f"cannot run {program!r}: no such file or directory")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return SpawnError(f"cannot run {program!r}: permission denied")
    return SpawnError(f"cannot run {program!r}: {exc.strerror or exc}")


def _close_fds(fds: Iterable[int]) -> None:
    for fd in list(fds):
        with contextlib.suppress(OSError):
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
