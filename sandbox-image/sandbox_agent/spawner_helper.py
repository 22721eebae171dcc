"""The spawner helper process itself (see `spawner` for the agent's side and the protocol), and the framing both
sides share.

It is a module of its own so that the helper, one per sandbox for as long as the sandbox lives, imports only
what it runs: a few low-level stdlib modules. The agent's side needs asyncio, whose import alone costs a Python
process about 6 MiB of private memory (docs/performance.md, 2026-11-28); the helper never runs an event loop.
"""

from __future__ import annotations

# Only built-in and low-level modules: `socket`, `selectors` and `signal` pull in `enum` (their constants become
# IntEnums), json pulls in `re` and `enum`, `contextlib` pulls in `collections`. Together they were 1.9 of the
# helper's 5.0 MiB (docs/performance.md, 2026-11-28), in every idle sandbox.
import _signal  # type: ignore[import-not-found]  # (no stubs: the constants are the signal module's ints)
import _socket
import ctypes
import errno
import os
import select
import sys
from itertools import accumulate

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
#
# A message is a list of strings: a first line with each string's length in characters, then the strings one
# after the other, all UTF-8 with "surrogatepass", which carries any str as it is (a lone surrogate in an argument
# reaches posix_spawn, which refuses it as it did before), as does a NUL inside a string (posix_spawn refuses that
# too: "embedded null byte"). A typical request decodes in about 13 µs here (json.loads: 5; a spawn costs the
# sandbox about 2.5 ms of CPU) and encodes as fast as json.dumps.
#   request  id cwd umask stdin(""/"1") stderr("pipe"/"stdout") argc argv... then env's names and values in pairs
#   replies  "ready" | "pid" id pid | "error" id errno strerror | "status" pid status


def _pack(fields: list[str]) -> bytes:
    return (" ".join([str(len(f)) for f in fields]) + "\n" + "".join(fields)).encode("utf-8", "surrogatepass")


def _unpack(data: bytes) -> list[str]:
    head, _, body = data.decode("utf-8", "surrogatepass").partition("\n")
    ends = list(accumulate(map(int, head.split())))
    if ends and ends[-1] != len(body):
        raise ValueError("malformed message on the spawner channel")
    return [body[start:end] for start, end in zip([0, *ends], ends, strict=False)]


def encode_request(message: dict[str, Any]) -> bytes:
    argv: list[str] = message["argv"]
    env: dict[str, str] = message["env"]
    fields = [str(message["id"]), message["cwd"], str(message["umask"]), "1" if message["stdin"] else "",
              message["stderr"], str(len(argv)), *argv]
    for pair in env.items():
        fields += pair
    return _pack(fields)


def decode_request(data: bytes) -> dict[str, Any]:
    fields = _unpack(data)
    argc = int(fields[5])
    argv, rest = fields[6:6 + argc], fields[6 + argc:]
    if len(argv) != argc or len(rest) % 2:
        raise ValueError("malformed request on the spawner channel")
    return {"id": int(fields[0]), "cwd": fields[1], "umask": int(fields[2]), "stdin": bool(fields[3]),
            "stderr": fields[4], "argv": argv, "env": dict(zip(rest[::2], rest[1::2], strict=True))}


def encode_reply(message: dict[str, Any]) -> bytes:
    if "error" in message:
        error = message["error"]
        return _pack(["error", str(message["id"]), str(error["errno"]), error["strerror"]])
    if "id" in message:
        return _pack(["pid", str(message["id"]), str(message["pid"])])
    if "status" in message:
        return _pack(["status", str(message["pid"]), str(message["status"])])
    return _pack(["ready"])


def decode_reply(data: bytes) -> dict[str, Any]:
    """The reply as the agent's side reads it (the keys `encode_reply` was given)."""
    kind, *rest = _unpack(data)
    if kind == "error":
        return {"id": int(rest[0]), "error": {"errno": int(rest[1]), "strerror": rest[2]}}
    if kind == "pid":
        return {"id": int(rest[0]), "pid": int(rest[1])}
    if kind == "status":
        return {"pid": int(rest[0]), "status": int(rest[1])}
    return {"ready": kind == "ready"}


def _frames(data: bytes) -> list[bytes]:
    parts = [data[i:i + FRAME] for i in range(0, len(data), FRAME)] or [b""]
    return [(_LAST if i == len(parts) - 1 else _MORE) + part for i, part in enumerate(parts)]


def _send_fds(sock: _socket.socket, frame: bytes, fds: list[int]) -> None:
    """`socket.send_fds`, without the socket module."""
    rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
    sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)] if fds else [])


def _recv_frame(sock: _socket.socket) -> tuple[bytes, list[int]]:
    """One datagram and the fds it carried (close-on-exec); b"" at end of stream."""
    data, ancdata, flags, _ = sock.recvmsg(
        FRAME + 1, _socket.CMSG_SPACE(_MAX_FDS * 4), _socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, usable, 4))
    if flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
        _close_all(fds)
        raise OSError(errno.EMSGSIZE, "truncated message on the spawner channel")
    return data, fds


class _Assembler:
    """Joins frames into messages; the fds travel with the last frame."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, frame: bytes) -> bytes | None:
        self._parts.append(frame[1:])
        if frame[:1] == _MORE:
            return None
        data, self._parts = b"".join(self._parts), []
        return data


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


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
    libc.prctl(_PR_SET_PDEATHSIG, _signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(0)


def _yield_to_the_agent() -> None:
    """Tool processes (inheriting from the helper) lose to the agent for CPU and for the OOM killer.

    Within the container's cgroup a fork bomb otherwise shares the CPU with the agent as equals,
    and health and abort wait behind hundreds of runnable tasks. Both changes need no privilege; the
    OOM score is not pinned (that would need CAP_SYS_RESOURCE), so `proc_guard` keeps it from being lowered.
    """
    try:
        os.nice(TOOL_NICENESS)
    except OSError:
        pass
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(TOOL_OOM_SCORE_ADJ))
    except OSError:
        pass


_DEFAULT_SIGNALS = (_signal.SIGPIPE, _signal.SIGXFSZ)
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
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass


def _serve(sock: _socket.socket) -> None:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    children: dict[int, int] = {}
    """pidfd -> the child's pid, for each command still running."""
    assembler = _Assembler()
    pending_fds: list[int] = []

    def send(message: dict[str, Any], fds: list[int] | None = None) -> None:
        *first, last = _frames(encode_reply(message))
        for frame in first:
            sock.sendmsg([frame])
        _send_fds(sock, last, fds or [])

    send({"ready": True})
    while True:
        for fd, _ in poller.poll():
            pid = children.pop(fd, None)
            if pid is not None:
                poller.unregister(fd)
                # The pidfd is readable once the child is exiting; this wait returns right away.
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                send({"pid": pid, "status": os.waitstatus_to_exitcode(status)})
                continue
            frame, fds = _recv_frame(sock)
            if not frame:
                return
            pending_fds.extend(fds)
            data = assembler.feed(frame)
            if data is None:
                continue
            request = decode_request(data)
            try:
                child = _spawn(request, pending_fds)
            except OSError as exc:
                send({"id": request["id"], "error": {"errno": exc.errno or 0, "strerror": exc.strerror or str(exc)}})
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                send({"id": request["id"], "error": {"errno": 0, "strerror": str(exc)}})
            else:
                pidfd = pidfds.pidfd_for(child)
                children[pidfd] = child
                poller.register(pidfd, select.POLLIN)
                send({"id": request["id"], "pid": child}, [pidfd])
            finally:
                _close_all(pending_fds)
                pending_fds = []


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    fd, parent = int(args[0]), int(args[1])
    _harden(parent)
    _close_on_exec_all()
    sock = _socket.socket(fileno=fd)
    sock.setblocking(True)
    try:
        _serve(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass


if __name__ == "__main__":
    main()
