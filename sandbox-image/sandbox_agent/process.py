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

from sandbox_agent import pidfds, spawner
from sandbox_agent.errors import SpawnError
from sandbox_agent.process_tree import Member, ProcessTree, forks_refused, outside, signal_pid

DRAIN_GRACE_S = 0.02
"""How long output pipes may stay open after the command exited (someone else holds them)."""
GROUP_POLL_S = 0.005
RESCAN_S = 0.025
"""While processes use the grace after the command exited, how often the tree is scanned again (a scan of a
fork bomb's hundreds of processes takes about 10 ms)."""
REAP_WAIT_S = 2.0
"""How long a stop waits for the zombies of a group with nothing alive left to be reaped (by init, or the
spawner for the command itself): the container's init reaps at once, a host's may take a second or two. Zombies
run nothing and hold no pipe, so past this they are left."""
KILL_BOUND_S = 2.0
"""How long a stop keeps killing a group that still has members (a fork bomb) before giving up."""
FREEZE_ROUNDS = 20
"""Stop-and-scan rounds before the kill; each catches the escaped children forked since the previous one."""
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
        self._leader_exited = asyncio.Event()
        """Set as soon as the command's own process exited (its pidfd), before its status is known."""
        self._returncode: int | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._timed_out = False
        self._aborted = False
        self._abort_reason = ""
        self.finished = False
        self._stdin = launched.stdin
        if launched.stdin is not None:
            # Written as the command reads (never a thread blocked on a full pipe: a command that does not read
            # held one of the agent's few worker threads for good, and its call could not be cancelled).
            os.set_blocking(launched.stdin, False)
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
        self._tree = ProcessTree(launched.pid)
        self._refused_at_start = forks_refused()

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
            if identity.uid is not None and identity.uid != os.geteuid():
                _shareable(theirs)
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
        self._leader_exited.set()
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
        # The fd stays open while a write waits on it: its number must not be reused under the write.
        self._stdin_writers += 1
        try:
            await _write_all(self._loop, fd, data)
        except OSError:
            self._stdin_close_pending = True
        finally:
            self._stdin_writers -= 1
            if self._stdin_close_pending:  # also when the write is cancelled (its call ended) while it waited
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
        """SIGTERM, then SIGKILL to what is still alive when the grace period ends or can no longer help.

        The grace is the command's, as in the reference (SIGKILL 200 ms after SIGTERM unless the command
        exited): while the command lives, all of it is given. Once the command has exited, the reference would
        end the call and leave the rest alone; here the rest is killed, and waited for only while some of it
        handles SIGTERM (cleaning up). The others cannot use the grace: with the default action they die anyway,
        and blocking or ignoring SIGTERM they would only live until the SIGKILL (bash blocks it while it retries a
        fork at the pids limit, so a fork bomb's shells all do). A call during which the session ran out of pids
        gets no grace at all.
        """
        self.close_stdin()
        await self._terminate()
        # Nothing is alive now. The command's own exit is also awaited through its pidfd, so that nothing of the
        # execution is left in the event loop, and the group's zombies are given a moment to be reaped: a group
        # that is gone from the kernel's view too is the simplest thing for a caller to check.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leader_exited.wait(), KILL_BOUND_S)
        reap_deadline = self._loop.time() + REAP_WAIT_S
        while self._loop.time() < reap_deadline:
            if not self._signal_group(0):
                break
            await asyncio.sleep(GROUP_POLL_S)

    async def _terminate(self) -> None:
        deadline = self._loop.time() + self._spec.kill_grace_s
        in_group = self._signal_group(signal.SIGTERM)
        if self._out_of_pids():
            await self._freeze_and_kill()
            return
        members = self._tree.members()
        for pid in outside(members, self.pid):  # children that left the group with setsid or setpgid
            signal_pid(pid, signal.SIGTERM)
        if not in_group and not members:
            return
        if not await self._outlive_grace(members, deadline):
            await self._freeze_and_kill()

    async def _outlive_grace(self, members: dict[int, Member], deadline: float) -> bool:
        """Waits while the grace can still be used; True once nothing of the call is alive (zombies are gone:
        they run nothing and hold no pipe), False when the rest must be killed."""
        next_scan = self._loop.time() + RESCAN_S
        while True:
            if not members:
                return True
            if not self._grace_in_use(members):
                return False
            now = self._loop.time()
            if now >= deadline:
                return False
            if not self._leader_exited.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._leader_exited.wait(), deadline - now)
                if self._leader_exited.is_set():
                    members = self._tree.members()
                    next_scan = self._loop.time() + RESCAN_S
                continue
            await asyncio.sleep(GROUP_POLL_S)
            # An empty group is cheap to see; leftovers that turned into zombies only a scan tells.
            if not self._signal_group(0) or self._loop.time() >= next_scan:
                members = self._tree.members()
                next_scan = self._loop.time() + RESCAN_S

    def _out_of_pids(self) -> bool:
        """Whether the session hit its pids limit during the call (a fork bomb): then there is no grace. Cleanup
        that needs a process could not start anyway, and the session needs its pids back."""
        refused = forks_refused()
        return refused is not None and self._refused_at_start is not None and refused > self._refused_at_start

    def _grace_in_use(self, members: dict[int, Member]) -> bool:
        return self.pid in members or any(member.sigterm == "handles" for member in members.values())

    async def _freeze_and_kill(self) -> None:
        """SIGKILLs the group and every process descended from it, until none is alive or KILL_BOUND_S passed.

        A signal to the group reaches every member, even one forking at that moment (the kernel restarts such a
        fork), so the group needs one SIGKILL. A child that called setsid() or setpgid() is out of the group and
        must be found by a scan, which races with its forks: the group and the escaped children are first
        stopped (a stopped process cannot fork, and its children stay linked to it by their parent pid) until a
        scan finds nobody new, then killed, then swept again.
        """
        deadline = self._loop.time() + KILL_BOUND_S
        self._signal_group(signal.SIGSTOP)
        stopped: set[int] = set()
        for _ in range(FREEZE_ROUNDS):
            escaped = outside(self._tree.members(), self.pid) - stopped
            if not escaped:
                break
            for pid in escaped:
                signal_pid(pid, signal.SIGSTOP)
            stopped |= escaped
        # The escaped ones are killed by pid first: once their parent is dead they are re-parented to init
        # and a scan would no longer find them.
        for pid in stopped:
            signal_pid(pid, signal.SIGKILL)
        self._signal_group(signal.SIGKILL)
        # Until the killed processes have exited the group still has members, and a scan of hundreds of them
        # costs a starved agent dearly: the cheap group probe says when to scan again.
        next_scan = self._loop.time() + RESCAN_S
        while True:
            await asyncio.sleep(GROUP_POLL_S)
            if not self._signal_group(0) or self._loop.time() >= next_scan:
                members = self._tree.members()
                if not members or self._loop.time() >= deadline:
                    return
                next_scan = self._loop.time() + RESCAN_S
                for pid in outside(members, self.pid):
                    signal_pid(pid, signal.SIGKILL)
                self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True


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

    return _Launched(proc.pid, pidfds.pidfd_for(proc.pid), stdin_w, outputs, exit_status)


def _spawn_error(program: str, exc: OSError) -> SpawnError:
    if exc.errno == errno.ENOENT:
        return SpawnError(f"cannot run {program!r}: no such file or directory")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return SpawnError(f"cannot run {program!r}: permission denied")
    return SpawnError(f"cannot run {program!r}: {exc.strerror or exc}")


def _shareable(fds: list[int]) -> None:
    """Lets the tool user reopen its own stdio pipes: the agent makes them, so they belong to root with mode 0600,
    and `echo x > /dev/stdout`, `tee /dev/stderr` or `/dev/fd/1` (a reopen through /proc/self/fd) were refused
    with EACCES, where upstream's shell, which owns its pipes, writes them. Only the holders of a pipe can reach it
    that way (another process's /proc/PID/fd is closed to tool processes), so the mode opens nothing else."""
    for fd in fds:
        with contextlib.suppress(OSError):  # gVisor refuses a pipe's mode change (EPERM): its pipes stay as made
            os.fchmod(fd, 0o666)


def _close_fds(fds: Iterable[int]) -> None:
    for fd in list(fds):
        with contextlib.suppress(OSError):
            os.close(fd)


async def _write_all(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
    """Writes `data` into the non-blocking `fd` as the pipe takes it (OSError: the reader is gone)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
            continue
        except BlockingIOError:
            pass
        ready = loop.create_future()
        loop.add_writer(fd, _settle, ready)
        try:
            await ready
        finally:
            loop.remove_writer(fd)


def _settle(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
