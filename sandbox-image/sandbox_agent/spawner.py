"""A helper process that already runs as the tool user and starts tool processes for the agent.

Switching uid in `Popen` makes CPython fork the whole (large) agent; a small process that is the
tool user already spawns with vfork, in a fraction of the time. Both sides of the channel are here:
`spawner_helper.main()` (the helper) and `Spawner` (the agent side, here).

Protocol, over a SOCK_SEQPACKET socketpair, each message in one or more frames (spawner_helper's framing):
  agent -> helper  {"id", "argv", "env", "cwd", "umask", "stdin": bool, "stderr": "pipe"|"stdout"}
                   fds: stdout write end, [stderr write end], [stdin read end]
  helper -> agent  {"ready": true} once at startup
                   {"id", "pid"} with the child's pidfd, or {"id", "error": {"errno", "strerror"}}
                   {"pid", "status"} when a child exited (Popen.returncode: negative for a signal)

Trust: the helper makes itself non-dumpable (tool processes of the same uid cannot ptrace it, read
its memory or its /proc fds), but they CAN kill it. The agent then notices the closed socket and
starts a new helper for the next spawn; commands the dead helper started still end normally (the
agent watches them through their pidfd and still kills their group), but their exit status is lost
and reported as -1. A request in flight when the helper dies fails with a SpawnError, it is never
retried: it may have started already. A helper that stops answering (a tool process may SIGSTOP
it) is killed and replaced the same way. Between exec and prctl there is a window (the Python
startup) in which a fresh helper is still dumpable: the first one starts when the sandbox is
claimed (or at its first spawn), before any tool process exists, and after every start the agent
checks that the helper is untraced and non-dumpable. A command the helper was asked to start whose
caller went away meanwhile is killed at once.

Lifetime: not started at boot, the helper starts when the sandbox is claimed (`Spawner.start()` from the
session's code snapshot, at CreateSession) or at a spawn, and an idle one (no request, no command of its own still
running) is stopped after LINGER_S: a pooled or long-idle sandbox holds no helper, about 3 MiB of its cgroup's
memory (docs/performance.md). Every start is checked the same way; a start while tool processes exist is one
they could already cause at will by killing the helper.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from sandbox_agent import pidfds
from sandbox_agent.errors import SpawnError

# The helper's side lives in its own module (it imports no asyncio); TOOL_NICENESS and FRAME are named here too.
from sandbox_agent.spawner_helper import FRAME as FRAME
from sandbox_agent.spawner_helper import TOOL_NICENESS as TOOL_NICENESS
from sandbox_agent.spawner_helper import _Assembler, _close_all, _frames, _recv_frame, decode_reply, encode_request

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 1.0
REPLY_TIMEOUT_S = 10.0
"""A helper silent this long on a request is stuck (a tool process may SIGSTOP it): it is replaced."""
STATUS_TIMEOUT_S = 2.0
"""Same, for the status of a command that has visibly exited."""
LINGER_S = 60.0
"""An idle helper is stopped after this long; the next spawn starts one again (15-45 ms). Longer than the usual pause
between a session's calls (a model's turn), so that those calls find it running."""
PYTHON = sys.executable
"""Interpreter of the helper; it must be executable by the tool user (host tests point it elsewhere)."""
_AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPER_MODULE = "sandbox_agent.spawner_helper"
"""What the helper runs: a module that imports no asyncio (one helper lives as long as its sandbox)."""
HELPER_FLAGS = ("-I", "-S", "-B")
"""Isolated, and without `site`: the helper needs nothing from site-packages, and site's imports (and the .pth
files it runs) cost every idle sandbox about 0.35 MiB."""


# -- the agent side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spawned:
    pid: int
    pidfd: int
    """Owned by the caller: readable once the child exited (it is not the agent's child)."""
    status: asyncio.Future[int | None]
    """The child's returncode, or None when the helper died before reporting it."""


_LOST = "the process spawner stopped"


class Spawner:
    """The agent's handle on one helper (one uid/gid); started on first use, restarted after a death."""

    def __init__(self, uid: int, gid: int, *, python: str | None = None) -> None:
        self.uid = uid
        self.gid = gid
        self._python = python or PYTHON
        self.loop = asyncio.get_running_loop()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ready: asyncio.Future[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._next_id = 0
        self._replies: dict[int, asyncio.Future[Spawned]] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        self._assembler = _Assembler()
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._last_used = 0.0
        self._linger: asyncio.TimerHandle | None = None

    @property
    def pid(self) -> int | None:
        """The helper's pid while it runs."""
        return self._proc.pid if self._proc is not None and self._sock is not None else None

    async def start(self) -> None:
        """Starts the helper unless it runs (or is starting): on a command's first spawn, or earlier (the agent
        starts it when its sandbox is claimed, so that a session's first command does not wait for it)."""
        if self._closed:
            raise SpawnError(_LOST)
        if self._sock is None:
            if self._starting is None:
                self._starting = self.loop.create_task(self._start())
            starting = self._starting
            try:
                await asyncio.shield(starting)
            finally:
                if starting.done() and self._starting is starting:
                    self._starting = None

    async def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, *, umask: int,
        stdout: int, stderr: int | None, stdin: int | None,
    ) -> Spawned:
        """Starts `argv` in a new session; the fds are the child's ends (the caller closes its copies)."""
        await self.start()
        sock = self._sock
        if sock is None:
            raise SpawnError(_LOST)
        self._next_id += 1
        self._last_used = self.loop.time()
        request_id = self._next_id
        fds = [stdout] + ([stderr] if stderr is not None else []) + ([stdin] if stdin is not None else [])
        message = {
            "id": request_id, "argv": argv, "env": env, "cwd": cwd, "umask": umask,
            "stdin": stdin is not None, "stderr": "pipe" if stderr is not None else "stdout",
        }
        reply: asyncio.Future[Spawned] = self.loop.create_future()
        self._replies[request_id] = reply
        watchdog = self.loop.call_later(REPLY_TIMEOUT_S, self._stalled, sock)
        try:
            try:
                await self._send(sock, _frames(encode_request(message)), fds)
            except OSError as exc:
                self._replies.pop(request_id, None)
                if sock is self._sock:
                    self._lost()
                raise SpawnError(f"{_LOST}: {exc.strerror or exc}") from exc
            try:
                return await reply
            except asyncio.CancelledError:
                # Cancelled just after the reply came in: that command must not run unseen either.
                if reply.done() and not reply.cancelled() and reply.exception() is None:
                    spawned = reply.result()
                    with contextlib.suppress(OSError):
                        os.killpg(spawned.pid, signal.SIGKILL)
                    os.close(spawned.pidfd)
                raise
        finally:
            watchdog.cancel()

    def exit_status(self, spawned: Spawned) -> asyncio.Future[int | None]:
        """The status of a command whose pidfd turned readable: it follows at once unless the helper is stuck."""
        if not spawned.status.done():
            watchdog = self.loop.call_later(STATUS_TIMEOUT_S, self._stalled, self._sock)
            spawned.status.add_done_callback(lambda _: watchdog.cancel())
        return spawned.status

    def _stalled(self, sock: socket.socket | None) -> None:
        if sock is not None and sock is self._sock:
            self._lost()

    async def _send(self, sock: socket.socket, frames: list[bytes], fds: list[int]) -> None:
        async with self._send_lock:
            for i, frame in enumerate(frames):
                last = i == len(frames) - 1
                while True:
                    try:
                        socket.send_fds(sock, [frame], fds if last else [])
                        break
                    except BlockingIOError:
                        writable: asyncio.Future[None] = self.loop.create_future()
                        self.loop.add_writer(sock, _settle, writable)
                        try:
                            await writable
                        finally:
                            self.loop.remove_writer(sock)

    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = f"import sys; sys.path.insert(0, {_AGENT_ROOT!r}); from {HELPER_MODULE} import main; main()"
        try:
            proc = subprocess.Popen(  # noqa: ASYNC220 - once per helper start
                [self._python, *HELPER_FLAGS, "-c", code, str(theirs.fileno()), str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd="/", env={"LANG": "C.UTF-8"},
                pass_fds=[theirs.fileno()], start_new_session=True, close_fds=True,
                user=self.uid, group=self.gid, extra_groups=[],
            )
        except OSError as exc:
            ours.close()
            raise SpawnError(f"cannot start the process spawner: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self._proc, self._sock = proc, ours
        self._ready = self.loop.create_future()
        self.loop.add_reader(ours, self._on_readable, ours)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
            _verify_untouchable(proc.pid)
        except (TimeoutError, SpawnError, OSError) as exc:
            self._lost()
            raise SpawnError(f"cannot start the process spawner: {exc}") from exc
        self._last_used = self.loop.time()
        self._linger = self.loop.call_later(LINGER_S, self._retire_if_idle, ours)

    def _retire_if_idle(self, sock: socket.socket) -> None:
        """Stops the helper once it has had nothing to do for LINGER_S; looks again later while it has."""
        if sock is not self._sock:
            return
        busy = bool(self._replies or self._exits) or self._send_lock.locked()
        idle = self.loop.time() - self._last_used
        if busy or idle < LINGER_S:
            # A command still running keeps it: only the helper can report that command's status.
            self._linger = self.loop.call_later(LINGER_S if busy else LINGER_S - idle, self._retire_if_idle, sock)
            return
        self._lost()  # nothing waits on it: no request in flight, no command left to report

    def _on_readable(self, sock: socket.socket) -> None:
        while sock is self._sock:
            try:
                frame, fds = _recv_frame(sock)
            except BlockingIOError:
                return
            except OSError:
                frame, fds = b"", []
            if not frame:
                self._lost()
                return
            data = self._assembler.feed(frame)
            if data is None:
                _close_all(fds)
                continue
            self._dispatch(decode_reply(data), fds)

    def _dispatch(self, message: dict[str, Any], fds: list[int]) -> None:
        if "id" in message:
            reply = self._replies.pop(message["id"], None)
            if "error" in message:
                _close_all(fds)
                if reply is not None and not reply.done():
                    reply.set_exception(_spawn_error(message["error"]))
                return
            pid = int(message["pid"])
            if reply is None or reply.done() or not fds:
                # Nobody waits any more (the caller was cancelled): the command must not run unseen.
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                _close_all(fds)
                return
            status: asyncio.Future[int | None] = self.loop.create_future()
            self._exits[pid] = status
            _close_all(fds[1:])
            reply.set_result(Spawned(pid, fds[0], status))
        elif "status" in message:
            _close_all(fds)
            self._last_used = self.loop.time()
            exited = self._exits.pop(int(message["pid"]), None)
            if exited is not None and not exited.done():
                exited.set_result(int(message["status"]))
        elif message.get("ready") and self._ready is not None and not self._ready.done():
            _close_all(fds)
            self._ready.set_result(None)

    def _lost(self) -> None:
        """The helper is gone (or unusable): fail what waits on it, reap it, start afresh next time."""
        sock, proc = self._sock, self._proc
        self._sock, self._proc = None, None
        self._stop_lingering()
        if sock is not None:
            self.loop.remove_reader(sock)
            sock.close()
        self._fail_waiters()
        if proc is not None:
            self._reap_later(proc)

    def _stop_lingering(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def _fail_waiters(self) -> None:
        self._assembler = _Assembler()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(SpawnError(_LOST))
            self._ready.exception()  # retrieved here: the starter reports its own error
        replies, self._replies = self._replies, {}
        for reply in replies.values():
            if not reply.done():
                reply.set_exception(SpawnError(_LOST))
        exits, self._exits = self._exits, {}
        for exited in exits.values():
            if not exited.done():
                exited.set_result(None)

    def _reap_later(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.1)  # a killed process is gone within a millisecond or so
            return
        try:
            pidfd = pidfds.pidfd_for(proc.pid)
        except ProcessLookupError:
            proc.wait()
            return

        def reap() -> None:
            self.loop.remove_reader(pidfd)
            os.close(pidfd)
            proc.wait()

        self.loop.add_reader(pidfd, reap)

    async def aclose(self) -> None:
        """Ends the helper (its socket's EOF) and waits for it; commands it started keep running."""
        self._closed = True
        if self._starting is not None:
            with contextlib.suppress(SpawnError, asyncio.CancelledError):
                await self._starting
        proc, sock = self._proc, self._sock
        self._proc, self._sock = None, None
        self._stop_lingering()
        if sock is not None:
            self.loop.remove_reader(sock)
            sock.close()
        self._fail_waiters()
        if proc is None or proc.poll() is not None:
            return
        pidfd = pidfds.pidfd_for(proc.pid)
        gone: asyncio.Future[None] = self.loop.create_future()
        self.loop.add_reader(pidfd, _settle, gone)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone, STOP_TIMEOUT_S)
        finally:
            self.loop.remove_reader(pidfd)
            os.close(pidfd)
        self._reap_later(proc)  # kills a helper that did not leave on its EOF

    def close(self) -> None:
        """Synchronous, for a loop that is gone: closes the channel, the helper exits on its EOF."""
        self._closed = True
        proc, sock = self._proc, self._sock
        self._proc, self._sock = None, None
        self._stop_lingering()  # (a TimerHandle's cancel needs no running loop)
        if sock is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(sock)
            sock.close()
        if proc is not None:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _spawn_error(error: dict[str, Any]) -> OSError:
    code = int(error.get("errno") or 0)
    return OSError(code, str(error.get("strerror") or os.strerror(code)))


def _verify_untouchable(pid: int) -> None:
    """A tool process may have attached to the helper before its prctl: refuse such a helper."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("TracerPid:") and int(line.split()[1]) != 0:
                raise SpawnError("the process spawner is being traced")
    # The entries under /proc/<pid> of a non-dumpable process belong to root.
    if os.getuid() == 0 and os.stat(f"/proc/{pid}/mem").st_uid != 0:
        raise SpawnError("the process spawner is still dumpable")


# -- one helper per identity and event loop ------------------------------------------------------

_shared: dict[tuple[int, int], Spawner] = {}


def shared(uid: int, gid: int) -> Spawner:
    """The agent's helper for this uid/gid, created for the running loop (tests run several loops)."""
    loop = asyncio.get_running_loop()
    spawner = _shared.get((uid, gid))
    if spawner is not None and spawner.loop is not loop:
        spawner.close()
        spawner = None
    if spawner is None or spawner._closed:
        spawner = _shared[(uid, gid)] = Spawner(uid, gid)
    return spawner


async def close_all() -> None:
    """Stops every helper of the running loop (agent shutdown)."""
    loop = asyncio.get_running_loop()
    spawners = list(_shared.values())
    _shared.clear()
    for spawner in spawners:
        if spawner.loop is loop:
            await spawner.aclose()
        else:
            spawner.close()


if __name__ == "__main__":
    from sandbox_agent.spawner_helper import main

    main()
