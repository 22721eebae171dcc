"""The agent's two shared streams (RunTools, ExecMany) on plain length-prefixed frames, beside their gRPC form.

A `bash` call's shape on the agent hop (one request, three events on an open stream) costs both processes about
0.5 ms of CPU through grpc.aio and under 0.05 ms as frames on a Unix stream (`tests/bench/framing_probe.py`):
HTTP/2, the completion queue and the poller thread's hand-off are most of a small message's cost. The messages
are the same protobufs and go through the same handlers, so a call's events, errors and trace are those of
the gRPC stream; the control plane uses the frames where it finds this socket and gRPC where it does not (a
forwarded or older agent). Every other agent RPC stays gRPC.

Wire format, both ways: a header (payload length, 4 bytes big-endian; kind, 1 byte) and the payload. The
first frame from the client is OPEN with the method's name; then MESSAGE frames carry serialized requests up
and events down; a handler that fails ends with one STATUS frame (`CODE\\ndetails`, as the gRPC status it
would have had). The socket is the agent's own (0600, root), as the gRPC one is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

from sandbox_agent.errors import AgentError

HEADER = struct.Struct("!IB")
OPEN, MESSAGE, STATUS = 0, 1, 2
MAX_PAYLOAD = 64 * 1024 * 1024
"""As the gRPC server's and channel's message limits."""
SOCKET_NAME = "frames.sock"
log = logging.getLogger(__name__)


def frames_path(socket_path: str) -> str:
    """The framed socket beside the agent's gRPC socket."""
    return os.path.join(os.path.dirname(socket_path), SOCKET_NAME)


def frame(kind: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind) + payload


class FrameError(AgentError):
    """A frame that breaks the format (too large, unknown kind): the connection is dropped."""


class FrameTooLargeError(FrameError):
    """A frame over MAX_PAYLOAD: what gRPC refuses as RESOURCE_EXHAUSTED."""


class StreamCutError(FrameError):
    """The connection ended inside a frame: the other end went away mid-write (lost, as a dropped gRPC stream)."""


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next frame, or None at a clean end of the stream (between frames)."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise StreamCutError("the stream ended inside a frame header") from exc
        return None
    size, kind = HEADER.unpack(header)
    if size > MAX_PAYLOAD:
        raise FrameTooLargeError(f"a frame of {size} bytes is over the {MAX_PAYLOAD}-byte limit")
    if kind not in (OPEN, MESSAGE, STATUS):
        raise FrameError(f"unknown frame kind {kind}")
    try:
        return kind, await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise StreamCutError("the stream ended inside a frame") from exc


Handler = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


class FramesServer:
    """Listens on `path` (0600) and serves each connection's one stream with `methods[name]`: its request type
    and the same handler the gRPC server calls (given no context: these handlers do not use one)."""

    def __init__(self, path: str, methods: dict[bytes, tuple[type[Any], Handler]]) -> None:
        self.path = path
        self._methods = methods
        self._server: asyncio.AbstractServer | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> bool:
        """Listens, or says it could not (a path over the Unix socket limit beside an agent socket just under it):
        the frames are a faster carrier, never the only one, so the agent then serves gRPC alone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        try:
            self._server = await asyncio.start_unix_server(self._connected, self.path)
        except OSError as exc:
            log.warning("no framed socket at %s, the streams stay on gRPC: %s", self.path, exc)
            return False
        os.chmod(self.path, 0o600)
        return True

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            await _serve(reader, writer, self._methods)
        finally:
            self._connections.pop(task, None)

    async def stop(self, grace_s: float) -> None:
        """As the gRPC server's stop: no new streams, what the handlers still yield within `grace_s` is sent
        (the exits of the commands the agent just stopped), then the streams are dropped. Dropping a
        connection ends its requests, which cancels its handler (_serve); the connection's own task ends by
        itself (asyncio logs a cancelled client-connected task as an error)."""
        if self._server is not None:
            self._server.close()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=grace_s)
        for writer in list(self._connections.values()):
            writer.transport.abort()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 methods: dict[bytes, tuple[type[Any], Handler]]) -> None:
    try:
        opened = await read_frame(reader)
        if opened is None or opened[0] != OPEN or opened[1] not in methods:
            return
        request_type, handler = methods[opened[1]]
        hung_up = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            try:
                while (item := await read_frame(reader)) is not None:
                    if item[0] != MESSAGE:
                        raise FrameError("only MESSAGE frames may follow OPEN")
                    yield request_type.FromString(item[1])
            except (FrameError, ConnectionError, ValueError):
                pass  # a broken client is a client gone
            hung_up.set()

        serving = asyncio.ensure_future(_stream(handler(requests(), None), writer))
        watch = asyncio.ensure_future(hung_up.wait())
        try:
            await asyncio.wait([serving, watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if not serving.done():
            # The control plane only ends its requests by dropping the stream: as a gRPC cancel, the handler
            # is cancelled (its calls are stopped the way they are when a gRPC client goes away).
            serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await serving
    except (FrameError, ConnectionError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def _stream(events: AsyncIterator[Any], writer: asyncio.StreamWriter) -> None:
    try:
        async for event in events:
            writer.write(frame(MESSAGE, event.SerializeToString()))
            await writer.drain()
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as exc:  # what grpc.aio reports for a handler's unexpected exception
        writer.write(frame(STATUS, f"UNKNOWN\nUnexpected {type(exc)}: {exc}".encode()))
        await writer.drain()
