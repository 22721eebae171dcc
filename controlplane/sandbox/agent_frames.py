"""The control plane's end of the agent's framed shared streams (sandbox_agent/frames.py): RunTools and ExecMany as
length-prefixed protobuf frames on a Unix socket instead of gRPC, where the agent has that socket (the other
methods: agent_framed_calls.py).

`FramedStreamCall` stands in for the `grpc.aio.StreamStreamCall` a `SharedStream` reads: the same events, and
the same `AioRpcError`s (the agent's STATUS frame, UNAVAILABLE for a lost connection, INTERNAL for frames that
break the format), so everything above the stream is unchanged. The agent is inside the sandbox: whatever it
sends is bounded (64 MiB a frame, as the gRPC channel's limit) and parsed as untrusted input.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from controlplane.sandbox.agent_framed_calls import status_error
from controlplane.sandbox.agent_streams import SharedStream, drain
from controlplane.sandbox.frame_deadline import read_frame_in_time
from sandbox_agent.frames import (
    MAX_PAYLOAD,
    MESSAGE,
    OPEN,
    STATUS,
    FrameError,
    FrameTooLargeError,
    StreamCutError,
    frame,
    frames_path,
)

CONNECT_TIMEOUT_S = 5.0
YIELD_EVERY = 16
"""Frames read before the event loop is given a turn: frames already buffered are read without waiting, so an agent
flooding small frames would otherwise hold the plane's loop, which serves every tenant."""


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class FramedStreamCall:
    """One framed stream: requests from `requests` up, events (of `event_type`) down."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                 requests: AsyncIterator[Any], event_type: type[Any]) -> None:
        self._reader = reader
        self._writer = writer
        self._event_type = event_type
        self._cancelled = False
        self._refused: grpc.aio.AioRpcError | None = None
        writer.write(frame(OPEN, method.encode()))
        self._sender = asyncio.ensure_future(self._send(requests))

    async def _send(self, requests: AsyncIterator[Any]) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            async for request in requests:
                payload = request.SerializeToString()
                if len(payload) > MAX_PAYLOAD:
                    # As gRPC's channel refuses a message over its limit: the stream fails, nothing is sent.
                    self._refused = _error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                           f"a request of {len(payload)} bytes is over the {MAX_PAYLOAD}-byte limit")
                    self._writer.close()
                    return
                self._writer.write(frame(MESSAGE, payload))
                await self._writer.drain()
            # As gRPC's half-close: the requests are over, the events may go on.
            if self._writer.can_write_eof():
                self._writer.write_eof()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        read = 0
        while True:
            read += 1
            if read % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            try:
                item = await read_frame_in_time(self._reader)
            except (StreamCutError, ConnectionError, OSError) as exc:
                if self._cancelled:
                    raise asyncio.CancelledError() from exc
                if self._refused is not None:
                    raise self._refused from exc
                raise _error(grpc.StatusCode.UNAVAILABLE, f"the agent's stream was lost: {exc}") from exc
            except FrameTooLargeError as exc:
                raise _error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the agent sent too much at once: {exc}") from exc
            except FrameError as exc:
                raise _error(grpc.StatusCode.INTERNAL, f"the agent's stream broke its format: {exc}") from exc
            if self._cancelled:
                raise asyncio.CancelledError()  # what iterating a cancelled grpc.aio call raises
            if item is None:
                if self._refused is not None:
                    raise self._refused
                raise _error(grpc.StatusCode.UNAVAILABLE, "the agent closed the stream without a status")
            kind, payload = item
            if kind == STATUS:
                error = status_error(payload)
                if error is None:
                    return  # the agent ended the stream (OK), as a gRPC stream's end
                raise error
            if kind != MESSAGE:
                raise _error(grpc.StatusCode.INTERNAL, f"the agent sent a frame of kind {kind} on a stream")
            try:
                event = self._event_type.FromString(payload)
            except Exception as exc:  # protobuf's DecodeError: what the agent sends is parsed as untrusted
                raise _error(grpc.StatusCode.INTERNAL, f"the agent sent an event that does not parse: {exc}") from exc
            yield event

    def cancel(self) -> bool:
        if self._cancelled:
            return False
        self._cancelled = True
        self._sender.cancel()
        self._writer.close()
        return True


class FramedAgent:
    """Opens framed streams to one agent, when its framed socket is there (a local agent of this version)."""

    def __init__(self, target: str) -> None:
        path = target.removeprefix("unix:") if target.startswith("unix:") else ""
        self._path = frames_path(path) if path else ""
        self._absent = not self._path

    async def open(self, method: str, requests: AsyncIterator[Any], event_type: type[Any]) -> FramedStreamCall | None:
        """A framed stream, or None where the agent has no framed socket (gRPC then carries the stream)."""
        if self._absent:
            return None
        # The socket's dir is the sandbox's too: an agent (root in there) could put a symlink in the socket's place,
        # and connecting by name would follow it to any socket of the host. The name is opened without following
        # links, only a socket is taken, and the connection goes through that very inode.
        try:
            fd = os.open(self._path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self._absent = True  # a forwarded or older agent: not asked again
            return None
        except OSError:
            return None
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                return None  # a link or anything else the sandbox put there: gRPC carries this stream
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(f"/proc/self/fd/{fd}"), CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError):
            return None  # not answering now (starting, or a stale socket): gRPC carries this stream
        finally:
            os.close(fd)
        return FramedStreamCall(reader, writer, method, requests, event_type)


class SharedStreams:
    """An agent's shared streams, one per method: framed where its framed socket answers, gRPC otherwise. Opened
    one at a time, so calls that start together share the stream the first of them opened."""

    def __init__(self, target: str) -> None:
        self._framed = FramedAgent(target)
        self._opening = asyncio.Lock()
        self._open: dict[str, SharedStream] = {}

    async def shared(self, method: str, rpc: Callable[[AsyncIterator[Any]], Any], request_type: type[Any],
                     event_type: type[Any]) -> SharedStream:
        """The open stream for `method`, or a new one when there is none (or it closed)."""
        async with self._opening:
            current = self._open.get(method)
            if current is not None and current.open:
                return current
            outbox: asyncio.Queue[object] = asyncio.Queue()
            call = await self._framed.open(method, drain(outbox, request_type), event_type)
            stream = SharedStream(call if call is not None else rpc(drain(outbox, request_type)), outbox, request_type)
            self._open[method] = stream
            return stream
