"""Every agent RPC as a framed call (sandbox_agent/frames.py): what the control plane uses where the agent's framed
socket is there (a Docker or local agent), so those agents need not serve gRPC at all.

`FramedStub` is called as the generated SandboxAgentStub is (same method names, messages, `timeout`, `metadata`,
`wait_for_ready`) and fails with the same `grpc.aio.AioRpcError`s, so the agent client's error mapping
(map_agent_error) sees the codes it saw over gRPC: the agent's STATUS frame, DEADLINE_EXCEEDED when the caller's
timeout passes (the connection is then dropped, which cancels the agent's handler, as gRPC's deadline does),
UNAVAILABLE for a lost or refused connection, INTERNAL for frames that break the format. What the agent sends is
untrusted input: bounded (64 MiB a frame, as the gRPC channel's limit) and parsed, never followed (the socket is
reached through its pinned inode: pinned_socket.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from controlplane.sandbox.frame_deadline import read_frame_in_time
from sandbox_agent.frames import (
    END,
    MAX_PAYLOAD,
    MESSAGE,
    OPEN,
    STATUS,
    FrameError,
    FrameTooLargeError,
    StreamCutError,
    frame,
    open_payload,
)
from sandbox_agent.rpc_methods import METHODS, Method, Shape

CONNECT_TIMEOUT_S = 5.0
MAX_STATUS_BYTES = 16 * 1024
"""Of a STATUS frame: gRPC's trailers stop there too (the rest of a longer one is not decoded)."""
READY_POLL_S = 0.005
YIELD_EVERY = 16
"""Frames read before the event loop is given a turn (agent_frames.py says why)."""

NO_STATUS = "the agent closed the call without a status"

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Target = Callable[[], str | None]
"""The framed socket's `unix:/proc/self/fd/N` (pinned_socket.PinnedSocket.target), None while it is not there."""


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def status_error(payload: bytes) -> grpc.aio.AioRpcError | None:
    """The error a STATUS frame names, or None for OK."""
    name, _, details = payload[:MAX_STATUS_BYTES].decode("utf-8", "replace").partition("\n")
    if name == "OK":
        return None
    code = getattr(grpc.StatusCode, name, None) if name.isupper() else None
    return rpc_error(code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, details)


class _Deadline:
    def __init__(self, timeout: float | None) -> None:
        self._at = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        if self._at is None:
            return None
        left = self._at - time.monotonic()
        if left <= 0:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return left

    async def within(self, work: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(work, self.left())
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


async def _replies(reader: asyncio.StreamReader, method: Method, deadline: _Deadline) -> AsyncIterator[Any]:
    """The call's responses until the agent's OK; its status as an AioRpcError otherwise."""
    read = 0
    while True:
        read += 1
        if read % YIELD_EVERY == 0:
            await asyncio.sleep(0)
        try:
            # Each frame whole within its deadline too: a call without one (a download) is not held by a drip.
            item = await deadline.within(read_frame_in_time(reader))
        except (StreamCutError, ConnectionError, OSError) as exc:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"the agent's connection was lost: {exc}") from exc
        except FrameTooLargeError as exc:
            raise rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the agent sent too much at once: {exc}") from exc
        except FrameError as exc:
            raise rpc_error(grpc.StatusCode.INTERNAL, f"the agent's reply broke its format: {exc}") from exc
        if item is None:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, NO_STATUS)
        kind, payload = item
        if kind == STATUS:
            error = status_error(payload)
            if error is not None:
                raise error
            return
        if kind != MESSAGE:
            raise rpc_error(grpc.StatusCode.INTERNAL, f"the agent sent a frame of kind {kind} in a reply")
        try:
            response = method.response.FromString(payload)
        except Exception as exc:  # protobuf's DecodeError: what the agent sends is parsed as untrusted
            raise rpc_error(grpc.StatusCode.INTERNAL, f"the agent sent a reply that does not parse: {exc}") from exc
        yield response


async def _single(reader: asyncio.StreamReader, method: Method, deadline: _Deadline) -> Any:
    """The one reply of a unary call: a second one fails the call as it arrives (never held: a hostile agent could
    send them without end)."""
    responses: list[Any] = []
    async for response in _replies(reader, method, deadline):
        if responses:
            raise rpc_error(grpc.StatusCode.INTERNAL, f"the agent sent more than one reply to a {method.name} call")
        responses.append(response)
    if not responses:
        raise rpc_error(grpc.StatusCode.INTERNAL, f"the agent ended a {method.name} call without its reply")
    return responses[0]


def _message(writer: asyncio.StreamWriter, request: Any) -> None:
    payload = request.SerializeToString()
    if len(payload) > MAX_PAYLOAD:  # as gRPC's channel refuses a message over its limit: nothing is sent
        raise rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"a request of {len(payload)} bytes is over the {MAX_PAYLOAD}-byte limit")
    writer.write(frame(MESSAGE, payload))


class _NoFramedStream:
    """A bidi stream asked of this stub: the shared streams open those themselves (agent_frames.SharedStreams) and
    come here only when the framed socket did not answer, which is the agent not answering."""

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._fail()

    async def _fail(self) -> AsyncIterator[Any]:
        raise rpc_error(grpc.StatusCode.UNAVAILABLE, "the agent's framed socket is not answering")
        yield  # pragma: no cover

    def cancel(self) -> bool:
        return False


class FramedStub:
    """One agent's RPCs over its framed socket, one connection a call."""

    def __init__(self, target: Target) -> None:
        self._target = target
        for name, method in METHODS.items():
            setattr(self, name, self._bound(method))

    def _bound(self, method: Method) -> Callable[..., Any]:
        if method.shape is Shape.UNARY:
            def unary(request: Any, **options: Any) -> Awaitable[Any]:
                return self._unary(method, request, **options)
            return unary
        if method.shape is Shape.SERVER_STREAM:
            def server_stream(request: Any, **options: Any) -> AsyncIterator[Any]:
                return self._server_stream(method, request, **options)
            return server_stream
        if method.shape is Shape.CLIENT_STREAM:
            def client_stream(requests: AsyncIterator[Any], **options: Any) -> Awaitable[Any]:
                return self._client_stream(method, requests, **options)
            return client_stream
        return lambda requests, **options: _NoFramedStream()

    async def _open(self, method: Method, deadline: _Deadline, metadata: Sequence[tuple[str, str]] | None,
                    wait_for_ready: bool | None) -> Connection:
        while True:
            target = self._target()
            try:
                if target is None:
                    raise FileNotFoundError("the agent's framed socket is not there")
                reader, writer = await deadline.within(asyncio.wait_for(
                    asyncio.open_unix_connection(target.removeprefix("unix:")), CONNECT_TIMEOUT_S))
                break
            except (TimeoutError, OSError) as exc:
                if not wait_for_ready:
                    raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"the agent's framed socket: {exc}") from exc
            await asyncio.sleep(READY_POLL_S)
            deadline.left()
        writer.write(frame(OPEN, open_payload(method.name, tuple(metadata or ()))))
        return reader, writer

    async def _unary(self, method: Method, request: Any, *, timeout: float | None = None,  # noqa: ASYNC109
                     metadata: Sequence[tuple[str, str]] | None = None, wait_for_ready: bool | None = None) -> Any:
        deadline = _Deadline(timeout)
        reader, writer = await self._open(method, deadline, metadata, wait_for_ready)
        try:
            _message(writer, request)
            return await _single(reader, method, deadline)
        finally:
            writer.close()

    async def _server_stream(self, method: Method, request: Any, *, timeout: float | None = None,  # noqa: ASYNC109
                             metadata: Sequence[tuple[str, str]] | None = None,
                             wait_for_ready: bool | None = None) -> AsyncIterator[Any]:
        deadline = _Deadline(timeout)
        reader, writer = await self._open(method, deadline, metadata, wait_for_ready)
        try:
            _message(writer, request)
            async for response in _replies(reader, method, deadline):
                yield response
        finally:
            writer.close()

    async def _client_stream(self, method: Method, requests: AsyncIterator[Any], *,
                             timeout: float | None = None,  # noqa: ASYNC109 - the generated stub's keyword
                             metadata: Sequence[tuple[str, str]] | None = None,
                             wait_for_ready: bool | None = None) -> Any:
        deadline = _Deadline(timeout)
        reader, writer = await self._open(method, deadline, metadata, wait_for_ready)

        async def send() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                async for request in requests:
                    _message(writer, request)
                    await writer.drain()
                writer.write(frame(END, b""))  # as gRPC's half-close: the requests are over

        sending = asyncio.ensure_future(send())
        reply = asyncio.ensure_future(_single(reader, method, deadline))
        try:
            await asyncio.wait([sending, reply], return_when=asyncio.FIRST_COMPLETED)
            if sending.done() and sending.exception() is not None and not reply.done():
                reply.cancel()
                sending.result()  # the requests' own failure (one over the size limit): the call fails with it
            # The agent may answer before the requests are over (a refusal): its answer is the call's, as in gRPC.
            return await reply
        finally:
            sending.cancel()
            reply.cancel()
            writer.close()
