"""Every agent RPC over the framed socket (sandbox_agent/frames.py, controlplane/sandbox/agent_framed_calls.py):
unary, server- and client-streaming calls give what the same call gives over gRPC (replies, status codes and
details), deadlines and cancels reach the agent's handler, and what a hostile agent or client sends is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from controlplane.errors import FailedPreconditionError, NotFoundError
from controlplane.sandbox import frame_deadline
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.agent_framed_calls import FramedStub
from controlplane.sandbox.agent_streams import MAX_DETAILS, status_error
from sandbox.v1 import agent_pb2, agent_pb2_grpc
from sandbox_agent.frames import END, HEADER, MAX_PAYLOAD, MESSAGE, OPEN, STATUS, frame, open_payload, read_frame
from tests.archives import tar_of
from tests.local_agent import local_agent
from tests.planes import short_tmp

Agent = tuple[GrpcSandboxAgent, Path]


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    async with local_agent() as (client, _, root):
        await client.health()
        yield client, root


def _grpc_stub(root: Path) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(f"unix:{root / 'agent.sock'}")
    return channel, agent_pb2_grpc.SandboxAgentStub(channel)


def _framed(root: Path) -> FramedStub:
    return FramedStub(lambda: f"unix:{root / 'frames.sock'}")


async def _status(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value.code(), raised.value.details() or ""


async def test_every_call_of_an_agent_with_a_framed_socket_goes_framed(agent: Agent) -> None:
    client, _ = agent
    assert isinstance(client._stub, FramedStub)
    await client.upload(tar_of({"a.txt": "alpha\n"}))
    listing = await client.list_files("", False, 10)
    assert [e.path for e in listing.entries] == ["a.txt"]
    assert b"".join([c async for c in client.read_file("a.txt")]) == b"alpha\n"
    assert client._channel is None  # no gRPC channel was ever made


async def test_framed_statuses_are_the_grpc_ones(agent: Agent) -> None:
    _, root = agent
    channel, grpc_stub = _grpc_stub(root)
    framed: Any = _framed(root)
    try:
        for name, request in (
            ("ListFiles", agent_pb2.ListFilesRequest(path="missing")),
            ("ListFiles", agent_pb2.ListFilesRequest(path="../outside")),
            ("SaveToolOutput", agent_pb2.SaveToolOutputRequest(name="../x", content=b"x")),
            ("ListCustomTools", agent_pb2.ListCustomToolsRequest(config_json="{not json")),
        ):
            over_grpc = await _status(getattr(grpc_stub, name)(request))
            assert await _status(getattr(framed, name)(request)) == over_grpc, name
            assert over_grpc[0] != grpc.StatusCode.OK
        streamed = agent_pb2.ReadFileRequest(path="missing")
        over_grpc = await _status(_drain(grpc_stub.ReadFile(streamed)))
        assert await _status(_drain(framed.ReadFile(streamed))) == over_grpc
        assert over_grpc[0] == grpc.StatusCode.NOT_FOUND

        async def nameless() -> AsyncIterator[agent_pb2.WriteFileRequest]:
            yield agent_pb2.WriteFileRequest(chunk=b"no path")

        over_grpc = await _status(grpc_stub.WriteFile(nameless()))
        assert await _status(framed.WriteFile(nameless())) == over_grpc
        assert over_grpc[0] == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await channel.close()


async def _drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def test_a_missing_file_maps_to_the_same_error_through_the_client(agent: Agent) -> None:
    client, _ = agent
    with pytest.raises(NotFoundError):
        await client.list_files("missing", False, 10)


async def test_a_cancelled_upload_stops_the_agents_handler(agent: Agent) -> None:
    client, root = agent
    hold = asyncio.Event()

    async def requests() -> AsyncIterator[agent_pb2.UploadWorkspaceRequest]:
        yield agent_pb2.UploadWorkspaceRequest(path="", chunk=b"")
        await hold.wait()  # never ends: the call is cancelled while the agent's extractor runs

    framed: Any = _framed(root)
    upload = asyncio.ensure_future(framed.UploadWorkspace(requests()))
    await _until(client, lambda running: running == 1)
    upload.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await upload
    await _until(client, lambda running: running == 0)


async def test_a_client_stream_broken_off_before_its_end_writes_nothing(agent: Agent) -> None:
    client, root = agent
    reader, writer = await asyncio.open_unix_connection(str(root / "frames.sock"))
    writer.write(frame(OPEN, b"WriteFile") + frame(MESSAGE, agent_pb2.WriteFileRequest(path="half.txt")
                                                   .SerializeToString())
                 + frame(MESSAGE, agent_pb2.WriteFileRequest(chunk=b"part of it").SerializeToString()))
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()  # no END: the requests broke off
    assert await asyncio.wait_for(reader.read(), 5) == b""  # nothing answered to a client gone
    await _until(client, lambda running: running == 0)
    assert not (root / "ws" / "half.txt").exists()
    # The same requests with END write the file: the END frame is what makes them whole.
    reader, writer = await asyncio.open_unix_connection(str(root / "frames.sock"))
    writer.write(frame(OPEN, b"WriteFile") + frame(MESSAGE, agent_pb2.WriteFileRequest(path="whole.txt")
                                                   .SerializeToString())
                 + frame(MESSAGE, agent_pb2.WriteFileRequest(chunk=b"all of it").SerializeToString())
                 + frame(END, b""))
    await writer.drain()
    replies = [await asyncio.wait_for(read_frame(reader), 5) for _ in range(2)]
    writer.close()
    assert [r[0] for r in replies if r is not None] == [MESSAGE, STATUS]
    assert (root / "ws" / "whole.txt").read_bytes() == b"all of it"


async def test_the_call_metadata_must_be_string_pairs(agent: Agent) -> None:
    client, root = agent
    for bad in (b"Health\n{", b"Health\n[[1, 2]]", b"Health\n" + b"[" * (70 * 1024)):
        reader, writer = await asyncio.open_unix_connection(str(root / "frames.sock"))
        writer.write(frame(OPEN, bad) + frame(MESSAGE, b""))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # dropped, nothing answered
        writer.close()
    reader, writer = await asyncio.open_unix_connection(str(root / "frames.sock"))
    writer.write(frame(OPEN, open_payload("Health", [("traceparent", "x")])) + frame(MESSAGE, b""))
    await writer.drain()
    reply = await asyncio.wait_for(read_frame(reader), 5)
    writer.close()
    assert reply is not None
    assert reply[0] == MESSAGE
    assert agent_pb2.HealthResponse.FromString(reply[1]).workspace == str(root / "ws")
    assert (await client.health()).workspace == str(root / "ws")


async def _until(client: GrpcSandboxAgent, want: Callable[[int], bool]) -> None:
    for _ in range(500):
        if want((await client.health()).running):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the agent's running count never got there: {(await client.health()).running}")


# -- against a hostile agent ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def hostile_agent(
        answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[tuple[FramedStub, list[str]]]:
    root = short_tmp()
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        finally:
            seen.append("closed by client" if await reader.read() == b"" else "more")
            writer.close()

    server = await asyncio.start_unix_server(serve, str(root / "frames.sock"))
    try:
        yield _framed(root), seen
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)


async def _opened(reader: asyncio.StreamReader) -> None:
    assert (await read_frame(reader) or (0, b""))[0] == OPEN
    assert (await read_frame(reader) or (0, b""))[0] == MESSAGE


@pytest.mark.parametrize(("reply", "code"), [
    (struct.pack("!IB", MAX_PAYLOAD + 1, MESSAGE), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (frame(9, b""), grpc.StatusCode.INTERNAL),
    (frame(MESSAGE, b"\xff\xff"), grpc.StatusCode.INTERNAL),
    (frame(MESSAGE, b"") * 2 + frame(STATUS, b"OK\n"), grpc.StatusCode.INTERNAL),
    (frame(STATUS, b"OK\n"), grpc.StatusCode.INTERNAL),
    (b"", grpc.StatusCode.UNAVAILABLE),
    (HEADER.pack(10, MESSAGE) + b"abc", grpc.StatusCode.UNAVAILABLE),
    (frame(STATUS, b"NOT_A_CODE\nwhatever"), grpc.StatusCode.UNKNOWN),
    (frame(STATUS, b"FAILED_PRECONDITION\nas the agent said"), grpc.StatusCode.FAILED_PRECONDITION),
])
async def test_what_a_hostile_agent_replies_is_bounded_and_typed(reply: bytes, code: grpc.StatusCode) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _opened(reader)
        writer.write(reply)
        writer.write_eof()  # and nothing more: a reply cut short ends at the end of the stream
        await writer.drain()

    async with hostile_agent(answer) as (stub, _):
        framed: Any = stub
        found, _ = await _status(asyncio.wait_for(framed.Health(agent_pb2.HealthRequest()), 10))
    assert found == code


async def test_a_unary_call_fails_at_its_second_reply_without_reading_on() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _opened(reader)
        writer.write(frame(MESSAGE, b"") * 2)
        await writer.drain()  # and never a status: the call fails at the second reply, not at the end

    async with hostile_agent(answer) as (stub, _):
        framed: Any = stub
        found, details = await _status(asyncio.wait_for(framed.Health(agent_pb2.HealthRequest()), 10))
        assert (found, details) == (grpc.StatusCode.INTERNAL, "the agent sent more than one reply to a Health call")


async def test_a_deadline_ends_the_call_and_drops_the_connection() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _opened(reader)  # and never answers

    async with hostile_agent(answer) as (stub, seen):
        framed: Any = stub
        found = await _status(framed.Health(agent_pb2.HealthRequest(), timeout=0.2))
        assert found == (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == ["closed by client"]  # what cancels the agent's handler


async def test_a_request_over_the_limit_is_refused_before_it_is_sent() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert (await read_frame(reader) or (0, b""))[0] == OPEN

    async def huge() -> AsyncIterator[agent_pb2.WriteFileRequest]:
        yield agent_pb2.WriteFileRequest(path="x")
        yield agent_pb2.WriteFileRequest(chunk=b"x" * (MAX_PAYLOAD + 1))

    async with hostile_agent(answer) as (stub, _):
        framed: Any = stub
        found, details = await _status(asyncio.wait_for(framed.WriteFile(huge()), 30))
    assert found == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the" in details


async def test_no_framed_socket_is_unavailable_at_once_unless_asked_to_wait() -> None:
    root = short_tmp()
    try:
        framed: Any = _framed(root)
        found, _ = await _status(framed.Health(agent_pb2.HealthRequest()))
        assert found == grpc.StatusCode.UNAVAILABLE
        found, _ = await _status(framed.Health(agent_pb2.HealthRequest(), timeout=0.2, wait_for_ready=True))
        assert found == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_an_agent_whose_framed_socket_serves_only_the_streams_is_reached_over_grpc(agent: Agent) -> None:
    # An image from before every RPC was framed: its frames.sock drops any call but RunTools and ExecMany unanswered.
    _, root = agent
    older = GrpcSandboxAgent(f"unix:{root / 'agent.sock'}", "sbx")
    (root / "frames.sock").unlink()

    async def streams_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)
        writer.close()

    server = await asyncio.start_unix_server(streams_only, str(root / "frames.sock"))
    try:
        assert (await older.health()).workspace == str(root / "ws")
        assert not isinstance(older._stub, FramedStub)
        with pytest.raises(NotFoundError):
            await older.list_files("missing", False, 10)
    finally:
        await older.close()
        server.close()


async def test_a_call_without_a_deadline_is_not_held_by_a_frame_that_never_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A download has no deadline of its own: a frame begun and dripped a byte at a time held it (and the plane's
    # copy turn it runs in) for good. Each frame must now arrive whole within FRAME_DEADLINE_S of its start.
    monkeypatch.setattr(frame_deadline, "FRAME_DEADLINE_S", 0.5)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _opened(reader)
        writer.write(HEADER.pack(1000, MESSAGE))
        for _ in range(50):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.1)

    async with hostile_agent(answer) as (stub, _):
        framed: Any = stub
        found, details = await _status(asyncio.wait_for(
            _drain(framed.DownloadWorkspace(agent_pb2.DownloadWorkspaceRequest())), 10))
    assert found == grpc.StatusCode.UNAVAILABLE
    assert "within 0.5 s of its start" in details


async def test_a_hostile_agents_error_text_is_cut_short() -> None:
    # 60 MiB of details in each of 20 failed calls took the plane to +2 GiB and its audit database to 1.2 GiB.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _opened(reader)
        writer.write(frame(STATUS, b"FAILED_PRECONDITION\n" + b"x" * (4 << 20)))
        await writer.drain()

    async with hostile_agent(answer) as (stub, _):
        framed: Any = stub
        found, details = await _status(asyncio.wait_for(framed.Health(agent_pb2.HealthRequest()), 10))
    assert found == grpc.StatusCode.FAILED_PRECONDITION
    assert len(details) < 16 * 1024
    error = status_error(found, details, "sb1")
    assert isinstance(error, FailedPreconditionError)
    assert len(str(error)) < MAX_DETAILS + 100
    assert str(error).endswith("more characters from the agent left out)")
