"""The per-node relay of the Swarm provider: mutual TLS in, the node's agent sockets out.

Runs as one global service per control-plane instance (stdlib only: it is shipped to every node
as a Swarm config and run by the sandbox image's Python). One request line (JSON) per connection:
  {"op": "ping"}                                    -> {"ok": true, "node": NODE_ID}
  {"op": "prepare", "instance": I, "sandbox": S}    creates ROOT/NODE_ID/I/S (mode 0700)
  {"op": "remove", "instance": I, "sandbox": S}     removes that dir
  {"op": "retain", "instance": I, "keep": [S...]}   removes the instance's other dirs
  {"op": "connect", "instance": I, "sandbox": S}    -> {"ok": true}, then the connection is spliced
                                                       to that dir's agent.sock
  {"op": "egress", "instance": I, "sandbox": S}     -> {"ok": true}; the relay listens on that dir's
                                                       egress.sock, and this connection waits there: when
                                                       the sandbox's agent connects, the relay sends
                                                       {"accepted": true} and splices the two
Only a client whose certificate the cluster CA signed gets this far (the control plane).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import socket
import ssl
import stat
import sys
from pathlib import Path

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SOCKET_NAME = "agent.sock"  # layout.SOCKET_NAME: this file ships alone and imports only the stdlib
EGRESS_NAME = "egress.sock"  # layout.EGRESS_SOCKET_NAME
EGRESS_MAX = 256
"""A sandbox's connections to egress.sock at once: its agent caps its own, but the relay does not trust it."""
EGRESS_WAIT_S = 10.0
"""How long a sandbox's connection waits for one of the control plane's streams (it keeps a few waiting)."""
MAX_LINE = 64 * 1024
CHUNK = 256 * 1024


def server_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        # The other direction may have closed this transport already (its peer went away first).
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    await asyncio.gather(pipe(a[0], b[1]), pipe(b[0], a[1]))


def private_socket(path: Path) -> socket.socket:
    """A listening-to-be socket bound at `path` with mode 0600 from its creation. The dir is the sandbox's agent's to
    write: a chmod by name after the bind would follow a link the agent put there meanwhile (to any file of the
    node), and an fchmod of a socket's descriptor changes the socket's own inode, not its name's (measured on
    Linux). bind(2) never follows a link (a name already there is EADDRINUSE), and takes its mode from the umask,
    set here for that one call only (the relay runs no other thread)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    return sock


class _Waiting:
    """One control-plane stream waiting for a connection of the sandbox. It never sends before it is handed one,
    so anything its reader returns meanwhile (an end) means the control plane let it go."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.watch = asyncio.ensure_future(reader.read(1))
        self.finished: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.taken = False


class EgressPoint:
    """A sandbox's way back to its session's proxy: egress.sock in its dir on this node (where its agent's
    forwarder connects), each connection carried over a stream the control plane opened to this relay. The
    sandbox's overlay stays without a route out: it reaches only this socket, and only its own session's proxy."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._server: asyncio.AbstractServer | None = None
        self._idle: collections.deque[_Waiting] = collections.deque()
        self._available = asyncio.Event()
        self._active = 0

    async def listen(self) -> None:
        if self._server is not None and self.path.exists():
            return
        if self._server is not None:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._accept, sock=private_socket(self.path), limit=MAX_LINE)

    async def wait(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Holds a control-plane stream until the sandbox connects (then until that connection ends) or the
        control plane closes it."""
        waiting = _Waiting(reader, writer)
        self._idle.append(waiting)
        self._available.set()
        try:
            await asyncio.wait({waiting.watch, waiting.finished}, return_when=asyncio.FIRST_COMPLETED)
            if waiting.taken:
                await waiting.finished
        finally:
            waiting.watch.cancel()
            with contextlib.suppress(ValueError):
                self._idle.remove(waiting)

    async def _take(self) -> _Waiting:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EGRESS_WAIT_S
        while True:
            while self._idle:
                waiting = self._idle.popleft()
                if not waiting.watch.done():
                    waiting.taken = True
                    waiting.watch.cancel()
                    return waiting
            self._available.clear()
            await asyncio.wait_for(self._available.wait(), max(0.0, deadline - loop.time()))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= EGRESS_MAX:
            writer.close()
            return
        self._active += 1
        waiting: _Waiting | None = None
        try:
            waiting = await self._take()
            waiting.writer.write(b'{"accepted": true}\n')
            await waiting.writer.drain()
            await splice((reader, writer), (waiting.reader, waiting.writer))
        except (TimeoutError, ConnectionError, OSError):
            pass  # no stream came (the control plane is away): the sandbox's client sees a closed connection
        finally:
            self._active -= 1
            writer.close()
            if waiting is not None and not waiting.finished.done():
                waiting.finished.set_result(b"")

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for waiting in self._idle:
            waiting.writer.close()
        self._idle.clear()


class Relay:
    def __init__(self, root: Path, node: str) -> None:
        self.root = root
        self.node = node
        self.egress: dict[Path, EgressPoint] = {}
        self.pinned: dict[Path, int] = {}
        """Each sandbox dir's agent socket, held by an O_PATH descriptor from its first connect on (as the Docker
        provider's pinned_socket.py): the dir is the sandbox's agent's to write, and a compromised agent that put a
        link in its socket's place would otherwise have the plane's calls spliced to another sandbox's agent."""

    def _agent_socket(self, directory: Path) -> str:
        fd = self.pinned.get(directory)
        if fd is None:
            fd = self.pinned[directory] = _open_socket(directory)
        return f"/proc/self/fd/{fd}"

    async def _connect_agent(self, directory: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the sandbox's agent through its pinned socket. A restarted agent binds a new socket in
        its dir: the pinned one, which nothing listens on any more, is given up for the one now there (taken with
        the same checks as the first), so that an honest restart can be reached again; one that still listens is
        kept whatever the name leads to now."""
        held = self.pinned.get(directory)
        dead = os.fstat(held).st_ino if held is not None else None
        try:
            return await asyncio.open_unix_connection(self._agent_socket(directory))
        except ConnectionRefusedError:
            if held is None:  # just taken from the name: nothing newer to take
                raise
        now = self.pinned.get(directory)
        if now is not None and os.fstat(now).st_ino == dead:  # not re-pinned meanwhile by a concurrent connect
            self._unpin(directory)
        return await asyncio.open_unix_connection(self._agent_socket(directory))

    def _unpin(self, directory: Path) -> None:
        fd = self.pinned.pop(directory, None)
        if fd is not None:
            os.close(fd)

    def _dir(self, request: dict[str, object]) -> Path:
        instance, sandbox = request.get("instance"), request.get("sandbox")
        if not isinstance(instance, str) or not isinstance(sandbox, str):
            raise ValueError("instance and sandbox must be strings")
        if not NAME.match(instance) or not NAME.match(sandbox):
            raise ValueError("bad instance or sandbox name")
        return self.root / self.node / instance / sandbox

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10.0)
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request is not an object")
            op = request.get("op")
            if op == "connect":
                try:
                    upstream = await self._connect_agent(self._dir(request))
                except OSError as exc:
                    await self._reply(writer, {"ok": False, "error": f"agent socket: {exc.strerror}"})
                    return
                await self._reply(writer, {"ok": True})
                await splice((reader, writer), upstream)
                return
            if op == "egress":
                directory = self._dir(request)
                if not directory.is_dir():
                    raise ValueError(f"sandbox dir {directory.name} is not prepared on this node")
                point = self.egress.setdefault(directory, EgressPoint(directory / EGRESS_NAME))
                await point.listen()
                await self._reply(writer, {"ok": True})
                await point.wait(reader, writer)
                return
            await self._reply(writer, self._control(op, request))
        except (TimeoutError, ValueError, ConnectionError, OSError) as exc:
            await self._reply(writer, {"ok": False, "error": str(exc) or type(exc).__name__})
        finally:
            writer.close()

    def _control(self, op: object, request: dict[str, object]) -> dict[str, object]:
        if op == "ping":
            return {"ok": True, "node": self.node}
        if op == "prepare":
            path = self._dir(request)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
            return {"ok": True, "node": self.node}
        if op == "remove":
            self._unpin(self._dir(request))
            self._close_egress(self._dir(request))
            shutil.rmtree(self._dir(request), ignore_errors=True)
            return {"ok": True}
        if op == "retain":
            keep = request.get("keep")
            if not isinstance(keep, list):
                raise ValueError("keep must be a list")
            base = self._dir({"instance": request.get("instance"), "sandbox": "x"}).parent
            removed = []
            if base.is_dir():
                for child in base.iterdir():
                    if child.name not in keep:
                        self._unpin(child)
                        self._close_egress(child)
                        shutil.rmtree(child, ignore_errors=True)
                        removed.append(child.name)
            return {"ok": True, "removed": removed}
        raise ValueError(f"unknown op {op!r}")

    def _close_egress(self, directory: Path) -> None:
        point = self.egress.pop(directory, None)
        if point is not None:
            point.close()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, message: dict[str, object]) -> None:
        try:
            writer.write(json.dumps(message).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass


def _open_socket(directory: Path) -> int:
    """An O_PATH descriptor of the agent socket in `directory`: the dir itself and the socket's name are opened
    without following links (a link: ELOOP), and only a socket is taken."""
    parent = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(SOCKET_NAME, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    finally:
        os.close(parent)
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, "not a socket (a file the sandbox put there): not connected")
    return fd


async def main() -> None:
    env = os.environ
    relay = Relay(Path(env.get("OCSB_ROOT", "/run/ocsb")), env["OCSB_NODE"])
    context = server_context(env["OCSB_CERT"], env["OCSB_KEY"], env["OCSB_CA"])
    server = await asyncio.start_server(
        relay.handle, host=env.get("OCSB_LISTEN", "0.0.0.0"), port=int(env["OCSB_PORT"]), ssl=context,
        limit=MAX_LINE,
    )
    print(f"relay of node {relay.node} listening on port {env['OCSB_PORT']}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
