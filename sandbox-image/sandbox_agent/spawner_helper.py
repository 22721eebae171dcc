"""The spawner helper process itself (see `spawner` for the agent's side and the protocol), and the framing both
sides share.

It is a module of its own so that the helper, one per sandbox for as long as the sandbox lives, imports only
what it runs: a few low-level stdlib modules. The agent's side needs asyncio, whose import alone costs a Python
process about 6 MiB of private memory (docs/performance.md, 2026-11-28); the helper never runs an event loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import sys

from sandbox_agent import pidfds, proc_guard

# Annotations only (they are never evaluated here): importing typing would cost the helper memory for nothing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

FRAME = 64 * 1024
"""Payload per SEQPACKET frame: large argv/env are split, since one datagram must fit the buffer."""
_MORE, _LAST = b"\x01", b"\x00"
_MAX_FDS = 4
TOOL_NICENESS = 10
TOOL_OOM_SCORE_ADJ = 1000
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


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


if __name__ == "__main__":
    main()
