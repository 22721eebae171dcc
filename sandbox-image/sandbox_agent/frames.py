"""The agent's RPCs on plain length-prefixed frames: every method of the service, beside (or instead of) gRPC.

A `bash` call's shape on the agent hop (one request, three events on an open stream) costs both processes about
0.5 ms of CPU through grpc.aio and under 0.05 ms as frames on a Unix stream (`tests/bench/framing_probe.py`):
HTTP/2, the completion queue and the poller thread's hand-off are most of a small message's cost. The messages
are the same protobufs and go through the same handlers, so a call's events, errors and trace are those of
the gRPC stream; the control plane uses the frames where it finds this socket and gRPC where it does not (an agent
behind the Swarm relay, which carries gRPC). An agent that serves frames only never imports grpc (rpc_status.py).

Wire format, both ways: a header (payload length, 4 bytes big-endian; kind, 1 byte) and the payload. One call a
connection. The first frame from the client is OPEN: the method's name, then optionally a newline and the call's
metadata as a JSON list of [key, value] pairs (the trace context gRPC would carry). MESSAGE frames carry
serialized requests up and responses down; a client-streaming call ends its requests with END (gRPC's
half-close). The agent ends every call with one STATUS frame (`CODE\\ndetails`, `OK` on success, as the gRPC
status it would have had). The client going away (its connection closing, or anything it sends once its requests
are over) is a cancel: the handler is cancelled, as when a gRPC client cancels or its deadline passes; deadlines
are the client's to keep. The socket is the agent's own (0600, root, in the root-only socket dir), as the gRPC
one is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sandbox_agent.errors import AgentError
from sandbox_agent.rpc_methods import Method, Shape
from sandbox_agent.rpc_status import CallAbortedError, FramedContext, RequestsLostError

HEADER = struct.Struct("!IB")
OPEN, MESSAGE, STATUS, END = 0, 1, 2, 3
MAX_PAYLOAD = 64 * 1024 * 1024
MAX_METADATA = 64 * 1024
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


def parse_header(header: bytes, kinds: tuple[int, ...]) -> tuple[int, int]:
    """A frame header's payload size and kind, checked as every reader of frames checks it (the agent's and the
    control plane's, frame_deadline.py): FrameError for one that breaks the format."""
    size, kind = HEADER.unpack(header)
    if size > MAX_PAYLOAD:
        raise FrameTooLargeError(f"a frame of {size} bytes is over the {MAX_PAYLOAD}-byte limit")
    if kind not in kinds:
        raise FrameError(f"unknown frame kind {kind}")
    return size, kind


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next frame, or None at a clean end of the stream (between frames)."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise StreamCutError("the stream ended inside a frame header") from exc
        return None
    size, kind = parse_header(header, (OPEN, MESSAGE, STATUS, END))
    try:
        return kind, await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise StreamCutError("the stream ended inside a frame") from exc


def open_payload(method: str, metadata: Sequence[tuple[str, str]] = ()) -> bytes:
    """An OPEN frame's payload: the method, and the call's metadata when it has any."""
    if not metadata:
        return method.encode()
    return method.encode() + b"\n" + json.dumps([[k, v] for k, v in metadata]).encode()


def parse_open(payload: bytes) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The method and metadata of an OPEN frame; FrameError for anything else (the client is dropped)."""
    name, _, raw = payload.partition(b"\n")
    if not raw:
        return name.decode("ascii", "replace"), ()
    if len(raw) > MAX_METADATA:
        raise FrameError(f"call metadata of {len(raw)} bytes is over the {MAX_METADATA}-byte limit")
    try:
        pairs = json.loads(raw)
    except ValueError as exc:
        raise FrameError(f"call metadata that does not parse: {exc}") from exc
    if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        raise FrameError("call metadata must be a list of [key, value] string pairs")
    return name.decode("ascii", "replace"), tuple((k, v) for k, v in pairs)


def status_payload(code: str, details: str) -> bytes:
    return f"{code}\n{details}".encode()


class FramesServer:
    """Listens on `path` (0600) and serves each connection's one call with the method of `service` the gRPC server
    would call, given a FramedContext."""

    def __init__(self, path: str, methods: dict[str, Method], service: object) -> None:
        self.path = path
        self._methods = methods
        self._service = service
        self._server: asyncio.AbstractServer | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> bool:
        """Listens, or says it could not (a path over the Unix socket limit beside an agent socket just under it):
        the agent then serves gRPC alone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        try:
            self._server = await asyncio.start_unix_server(self._connected, self.path)
        except OSError as exc:
            log.warning("no framed socket at %s, the agent serves gRPC alone: %s", self.path, exc)
            return False
        os.chmod(self.path, 0o600)
        return True

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            await _serve(reader, writer, self._methods, self._service)
        finally:
            self._connections.pop(task, None)

    async def stop(self, grace_s: float) -> None:
        """As the gRPC server's stop: no new calls, what the handlers still send within `grace_s` is sent
        (the exits of the commands the agent just stopped), then the connections are dropped. Dropping a
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


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, methods: dict[str, Method],
                 service: object) -> None:
    try:
        opened = await read_frame(reader)
        if opened is None or opened[0] != OPEN:
            return
        name, metadata = parse_open(opened[1])
        method = methods.get(name)
        if method is None:
            return  # a client that breaks the protocol is dropped (the plane only asks for the service's methods)
        hung_up = asyncio.Event()
        requests_over = asyncio.Event()
        arg: Any
        if method.shape.streams_requests:
            arg = _requests(reader, method, hung_up, requests_over)
        else:
            first = await read_frame(reader)
            if first is None or first[0] != MESSAGE:
                return
            try:
                arg = method.request.FromString(first[1])
            except Exception:  # protobuf's DecodeError: what gRPC refuses as INTERNAL
                writer.write(frame(STATUS, status_payload("INTERNAL", f"a {name} request that does not parse")))
                return
            requests_over.set()

        async def watch() -> None:
            # Once the requests are over, anything more from the client (its end of the stream, above all) is the
            # client gone: the call is cancelled. A bidi stream's end of requests is that already (_requests).
            await requests_over.wait()
            with contextlib.suppress(ConnectionError, OSError):
                await reader.read(1)
            hung_up.set()

        handler = getattr(service, method.name)
        serving = asyncio.ensure_future(_respond(method, handler(arg, FramedContext(metadata)), writer, hung_up))
        watchers = [asyncio.ensure_future(watch()), asyncio.ensure_future(hung_up.wait())]
        try:
            await asyncio.wait([serving, *watchers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watcher in watchers:
                watcher.cancel()
        if not serving.done():
            # As a gRPC cancel: the handler is cancelled (its calls are stopped the way they are when a gRPC client
            # goes away).
            serving.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await serving
    except (FrameError, ConnectionError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def _requests(reader: asyncio.StreamReader, method: Method, hung_up: asyncio.Event,
                    requests_over: asyncio.Event) -> AsyncIterator[Any]:
    """A streamed call's requests. A bidi stream's requests end when the client goes (the plane only ends its shared
    streams by dropping them); a client-streaming call's end at END, and breaking off before END is the client gone:
    the handler sees RequestsLostError (and is cancelled), never a short stream it could take for a whole one."""
    try:
        while (item := await read_frame(reader)) is not None:
            if item[0] == END and method.shape is Shape.CLIENT_STREAM:
                requests_over.set()
                return
            if item[0] != MESSAGE:
                raise FrameError("only MESSAGE frames may follow OPEN")
            try:
                request = method.request.FromString(item[1])
            except Exception as exc:  # protobuf's DecodeError
                raise FrameError(f"a {method.name} request that does not parse") from exc
            yield request
    except (FrameError, ConnectionError, OSError):
        pass  # a broken client is a client gone
    hung_up.set()
    if method.shape is Shape.CLIENT_STREAM:
        raise RequestsLostError(f"the caller of {method.name} went away before the end of its requests")


async def _respond(method: Method, result: Any, writer: asyncio.StreamWriter, hung_up: asyncio.Event) -> None:
    try:
        if method.shape.streams_responses:
            async for response in result:
                _send(writer, response.SerializeToString())
                await writer.drain()
        else:
            _send(writer, (await result).SerializeToString())
        status = status_payload("OK", "")
    except (asyncio.CancelledError, ConnectionError):
        raise
    except CallAbortedError as exc:
        status = status_payload(exc.code.name, exc.details)
    except _ResponseTooLargeError as exc:
        status = status_payload("RESOURCE_EXHAUSTED", str(exc))
    except Exception as exc:  # what grpc.aio reports for a handler's unexpected exception
        status = status_payload("UNKNOWN", f"Unexpected {type(exc)}: {exc}")
    if hung_up.is_set():
        return  # the client went away (or broke the format): nobody to tell
    writer.write(frame(STATUS, status))
    await writer.drain()


class _ResponseTooLargeError(FrameError):
    """A response over MAX_PAYLOAD: gRPC's server refuses to send it (RESOURCE_EXHAUSTED); so does this one."""


def _send(writer: asyncio.StreamWriter, payload: bytes) -> None:
    if len(payload) > MAX_PAYLOAD:
        raise _ResponseTooLargeError(f"a response of {len(payload)} bytes is over the {MAX_PAYLOAD}-byte limit")
    writer.write(frame(MESSAGE, payload))
