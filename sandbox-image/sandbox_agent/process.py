"""One command run as the tool user: output streamed in order, the whole process group stopped.

Completion is the exit of the command itself (seen through a pidfd), not the end of its output
pipes: a backgrounded child that keeps stdout open must not hang the call. After the exit the
pipes are drained briefly, then closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sandbox_agent.errors import SpawnError

DRAIN_GRACE_S = 0.02
"""How long output pipes may stay open after the command exited (someone else holds them)."""
GROUP_POLL_S = 0.005
READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Identity:
    """Who tool processes run as; `uid=None` keeps the agent's own user (unprivileged test runs)."""

    uid: int | None
    gid: int | None


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


class Execution:
    """A running command. Start with `await Execution.start(...)`, then iterate `events()`."""

    def __init__(self, proc: subprocess.Popen[bytes], spec: ExecSpec, buffer_limit: int) -> None:
        self._proc = proc
        self._spec = spec
        self._buffer_limit = buffer_limit
        self._loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        self.pid = proc.pid
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
        self._pipes: dict[int, str] = {}
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            if pipe is not None:
                fd = pipe.fileno()
                os.set_blocking(fd, False)
                self._pipes[fd] = stream
                self._loop.add_reader(fd, self._on_readable, fd)
        self._pidfd = os.pidfd_open(proc.pid)
        self._loop.add_reader(self._pidfd, self._on_exit)
        self._timer = (
            self._loop.call_later(spec.timeout_s, self._on_timeout) if spec.timeout_s else None
        )

    @classmethod
    async def start(cls, spec: ExecSpec, identity: Identity, buffer_limit: int) -> Execution:
        if not spec.argv:
            raise SpawnError("nothing to run: the command is empty")
        if not os.path.isdir(spec.cwd):  # noqa: ASYNC240 - one stat on a local filesystem
            raise SpawnError(f"working directory {spec.cwd} does not exist")
        extra: dict[str, Any] = {}
        if identity.uid is not None:
            extra = {"user": identity.uid, "group": identity.gid, "extra_groups": []}
        try:
            proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec returns in about a millisecond
                spec.argv,
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if spec.merge_stderr else subprocess.PIPE,
                cwd=spec.cwd,
                env=spec.env,
                start_new_session=True,
                close_fds=True,
                umask=0o022,
                **extra,
            )
        except FileNotFoundError as exc:
            raise SpawnError(f"cannot run {spec.argv[0]!r}: no such file or directory") from exc
        except PermissionError as exc:
            raise SpawnError(f"cannot run {spec.argv[0]!r}: permission denied") from exc
        except OSError as exc:
            raise SpawnError(f"cannot run {spec.argv[0]!r}: {exc.strerror or exc}") from exc
        return cls(proc, spec, buffer_limit)

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
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None and not pipe.closed and pipe.fileno() == fd:
                pipe.close()

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
        if self._stop_task is not None:
            await asyncio.shield(self._stop_task)
        yield self._exit_event()
        self.finished = True

    def _exit_event(self) -> Exit:
        rc = self._returncode if self._returncode is not None else -signal.SIGKILL
        sig = -rc if rc < 0 else 0
        return Exit(
            exit_code=128 + sig if sig else rc,
            signal=sig,
            timed_out=self._timed_out,
            aborted=self._aborted,
            duration_ms=int((time.monotonic() - self._started) * 1000),
            abort_reason=self._abort_reason,
        )

    # -- exit, stdin, stop --------------------------------------------------------------------

    def _on_exit(self) -> None:
        rc = self._proc.poll()
        if rc is None:  # pidfd readable means exited; poll once more on the next turn
            self._loop.call_soon(self._on_exit)
            return
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._returncode = rc
        if self._timer is not None:
            self._timer.cancel()
        self._exited.set()
        self._wakeup.set()

    async def write_stdin(self, data: bytes) -> None:
        pipe = self._proc.stdin
        if pipe is None or pipe.closed:
            return
        try:
            await asyncio.to_thread(_write_all, pipe.fileno(), data)
        except (BrokenPipeError, ValueError, OSError):
            self.close_stdin()

    def close_stdin(self) -> None:
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

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
        if not self._signal_group(signal.SIGTERM):
            return
        if await self._group_gone_within(self._spec.kill_grace_s):
            return
        self._signal_group(signal.SIGKILL)
        await self._group_gone_within(2.0)

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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
