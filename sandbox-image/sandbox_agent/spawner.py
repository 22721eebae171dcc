"""A helper process that already runs as the tool user and starts tool processes for the agent.

Switching uid in `Popen` makes CPython fork the whole (large) agent; a small process that is the
tool user already spawns with vfork, in a fraction of the time. Both sides of the channel are here:
`main()` (the helper, `python3 -m sandbox_agent.spawner FD PARENT`) and `Spawner` (the agent side).

Protocol, over a SOCK_SEQPACKET socketpair, each message JSON in one or more frames:
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
startup) in which a fresh helper is still dumpable: the first one starts with the agent's first
spawn, at boot, before any tool process exists, and after every start the agent checks that the
helper is untraced and non-dumpable. A command the helper was asked to start whose caller went
away meanwhile is killed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sandbox_agent import pidfds, proc_guard
from sandbox_agent.errors import SpawnError

FRAME = 64 * 1024
"""Payload per SEQPACKET frame: large argv/env are split, since one datagram must fit the buffer."""
_MORE, _LAST = b"\x01", b"\x00"
_MAX_FDS = 4
START_TIMEOUT_S = 10.0
TOOL_NICENESS = 10
TOOL_OOM_SCORE_ADJ = 1000
STOP_TIMEOUT_S = 1.0
REPLY_TIMEOUT_S = 10.0
"""A helper silent this long on a request is stuck (a tool process may SIGSTOP it): it is replaced."""
STATUS_TIMEOUT_S = 2.0
"""Same, for the status of a command that has visibly exited."""
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
PYTHON = sys.executable
"""Interpreter of the helper; it must be executable by the tool user (host tests point it elsewhere)."""
_AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- framing (both sides) -----------------------------------------------------------------------


def _frames(message: dict[str, Any]) -> list[bytes]:
    data = json.dumps(message, separators=(",", ":")).encode()
    parts = [data[i:i + FRAME] for i in range(0, len(data), FRAME)] or [b""]
    return [(_LAST if i == len(parts) - 1 else _MORE) + part for i, part in enumerate(parts)]


def _recv_frame(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One datagram and the fds it carried (close-on-exec); b"" at end of stream."""
    data, ancdata, flags, _ = sock.recvmsg(
        FRAME + 1, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, usable, 4))
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        _close_all(fds)
        raise OSError(errno.EMSGSIZE, "truncated message on the spawner channel")
    return data, fds


class _Assembler:
    """Joins frames into messages; the fds travel with the last frame."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, frame: bytes) -> dict[str, Any] | None:
        self._parts.append(frame[1:])
        if frame[:1] == _MORE:
            return None
        data, self._parts = b"".join(self._parts), []
        message: dict[str, Any] = json.loads(data)
        return message


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# -- the helper process -------------------------------------------------------------------------


def _harden(parent: int) -> None:
    _yield_to_the_agent()  # first: a non-dumpable process's /proc/self files belong to root
    # Then no tool process started from here may write under /proc: the OOM score above is not pinned, and a
    # tool process lowering it back to 0 could make the agent the OOM killer's choice (proc_guard).
    proc_guard.restrict_proc_writes()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    # The socket's EOF already ends the helper with the agent; the signal also covers a stuck read.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(0)


def _yield_to_the_agent() -> None:
    """Tool processes (inheriting from the helper) lose to the agent for CPU and for the OOM killer.

    Within the container's cgroup a fork bomb otherwise shares the CPU with the agent as equals,
    and health and abort wait behind hundreds of runnable tasks. Both changes need no privilege; the
    OOM score is not pinned (that would need CAP_SYS_RESOURCE), so `proc_guard` keeps it from being lowered.
    """
    with contextlib.suppress(OSError):
        os.nice(TOOL_NICENESS)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(TOOL_OOM_SCORE_ADJ))


_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
"""Ignored by CPython (so by the helper); a command starts with them at their defaults, as Popen gives it."""


def _spawn(request: dict[str, Any], fds: list[int]) -> int:
    """Starts the command in a session of its own; its pid.

    `posix_spawn` (a vfork underneath) with what Popen(cwd, umask, start_new_session, close_fds) would do:
    the helper is single-threaded, so it takes the command's directory and umask itself first, and every
    fd of its own is close-on-exec (`_close_on_exec_all`), so the command gets fds 0-2 only.
    """
    stdout = fds[0]
    rest = fds[1:]
    stderr = stdout
    if request["stderr"] == "pipe":
        stderr, rest = rest[0], rest[1:]
    actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_DUP2, rest[0], 0) if request["stdin"] else (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]
    argv: list[str] = request["argv"]
    env: dict[str, str] = request["env"]
    if not argv:
        raise ValueError("empty argv")
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    failure: OSError | None = None
    for program in _candidates(argv[0], env):
        try:
            return os.posix_spawn(program, argv, env, file_actions=actions, setsid=True,
                                  setsigdef=_DEFAULT_SIGNALS)
        except OSError as exc:
            # As execvp (and Popen): a missing candidate is skipped, the first other failure is kept.
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) and failure is None:
                failure = exc
    raise failure or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])


def _candidates(name: str, env: dict[str, str]) -> Iterator[str]:
    """Where `name` may be, in order: itself when it has a slash, else each file of that name on env's PATH
    (the first directory's entry when there is none, for the error)."""
    if "/" in name:
        yield name
        return
    paths = [os.path.join(directory, name) for directory in os.get_exec_path(env)]
    found = False
    for path in paths:
        if os.path.isfile(path):
            found = True
            yield path
    if not found and paths:
        yield paths[0]


def _close_on_exec_all() -> None:
    """Marks every fd the helper holds close-on-exec (the channel itself came inheritable)."""
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)


def _serve(sock: socket.socket) -> None:
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    assembler = _Assembler()
    pending_fds: list[int] = []

    def send(message: dict[str, Any], fds: list[int] | None = None) -> None:
        *first, last = _frames(message)
        for frame in first:
            sock.sendmsg([frame])
        socket.send_fds(sock, [last], fds or [])

    send({"ready": True})
    while True:
        for key, _ in selector.select():
            if key.data is not None:
                pid: int = key.data
                selector.unregister(key.fileobj)
                # The pidfd is readable once the child is exiting; this wait returns right away.
                _, status = os.waitpid(pid, 0)
                os.close(key.fd)
                send({"pid": pid, "status": os.waitstatus_to_exitcode(status)})
                continue
            frame, fds = _recv_frame(sock)
            if not frame:
                return
            pending_fds.extend(fds)
            request = assembler.feed(frame)
            if request is None:
                continue
            try:
                child = _spawn(request, pending_fds)
            except OSError as exc:
                send({"id": request["id"], "error": {"errno": exc.errno or 0, "strerror": exc.strerror or str(exc)}})
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                send({"id": request["id"], "error": {"errno": 0, "strerror": str(exc)}})
            else:
                pidfd = pidfds.pidfd_for(child)
                selector.register(pidfd, selectors.EVENT_READ, child)
                send({"id": request["id"], "pid": child}, [pidfd])
            finally:
                _close_all(pending_fds)
                pending_fds = []


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    fd, parent = int(args[0]), int(args[1])
    _harden(parent)
    _close_on_exec_all()
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    try:
        _serve(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass


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

    @property
    def pid(self) -> int | None:
        """The helper's pid while it runs."""
        return self._proc.pid if self._proc is not None and self._sock is not None else None

    async def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, *, umask: int,
        stdout: int, stderr: int | None, stdin: int | None,
    ) -> Spawned:
        """Starts `argv` in a new session; the fds are the child's ends (the caller closes its copies)."""
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
        sock = self._sock
        if sock is None:
            raise SpawnError(_LOST)
        self._next_id += 1
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
                await self._send(sock, _frames(message), fds)
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
        code = f"import sys; sys.path.insert(0, {_AGENT_ROOT!r}); from sandbox_agent.spawner import main; main()"
        try:
            proc = subprocess.Popen(  # noqa: ASYNC220 - once per helper start
                [self._python, "-I", "-B", "-c", code, str(theirs.fileno()), str(os.getpid())],
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
            message = self._assembler.feed(frame)
            if message is None:
                _close_all(fds)
                continue
            self._dispatch(message, fds)

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
        if sock is not None:
            self.loop.remove_reader(sock)
            sock.close()
        self._fail_waiters()
        if proc is not None:
            self._reap_later(proc)

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
    main()
