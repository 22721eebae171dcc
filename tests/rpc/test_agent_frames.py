"""The agent's shared streams on length-prefixed frames (sandbox_agent/frames.py, controlplane/sandbox/agent_frames.py):
used where the agent has its framed socket, gRPC where it has not, and whatever a hostile agent or client sends
is bounded and ends the stream with the error a broken gRPC stream would have given."""

from __future__ import annotations

import asyncio
import shutil
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from controlplane.core.seam.messages import CommandSpec
from controlplane.errors import ResourceExhaustedError
from controlplane.sandbox import agent_frames
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.agent_frames import YIELD_EVERY, FramedStreamCall, SharedStreams
from controlplane.sandbox.agent_streams import drain
from sandbox.v1 import agent_pb2
from sandbox_agent.config import AgentConfig
from sandbox_agent.frames import HEADER, MAX_PAYLOAD, MESSAGE, OPEN, STATUS, frame, frames_path
from sandbox_agent.serving import serve
from tests.local_agent import local_agent
from tests.planes import short_tmp
from tests.rpc.test_agent_tool_stream import bash, collect


@pytest.fixture
async def agent() -> AsyncIterator[tuple[GrpcSandboxAgent, Path]]:
    async with local_agent("a.sock") as (client, _, root):
        yield client, root


async def test_calls_and_commands_ride_frames_where_the_agent_has_the_socket(
        agent: tuple[GrpcSandboxAgent, Path]) -> None:
    client, root = agent
    assert (root / "frames.sock").is_socket()
    assert oct((root / "frames.sock").stat().st_mode & 0o777) == "0o600"
    events = await collect(await client.run_builtin(bash("echo framed")))
    assert "framed" in repr(events[-1])
    stream = await client.exec(CommandSpec(argv=["echo", "x"]))
    assert [e async for e in stream.events()]
    assert isinstance(client._tool_stream and client._tool_stream._call, FramedStreamCall)
    assert isinstance(client._exec_stream and client._exec_stream._call, FramedStreamCall)


async def test_grpc_carries_the_streams_where_no_framed_socket_is(agent: tuple[GrpcSandboxAgent, Path]) -> None:
    client, root = agent
    (root / "frames.sock").unlink()  # as a forwarded (swarm) or an older agent: no framed socket beside it
    events = await collect(await client.run_builtin(bash("echo over-grpc")))
    assert "over-grpc" in repr(events[-1])
    assert client._tool_stream is not None
    assert not isinstance(client._tool_stream._call, FramedStreamCall)


async def test_calls_that_start_together_share_one_stream(agent: tuple[GrpcSandboxAgent, Path]) -> None:
    client, _ = agent
    runs = await asyncio.gather(*(client.run_builtin(bash(f"echo {i}", call_id=f"c{i}")) for i in range(5)))
    assert len({id(run._stream) for run in runs}) == 1  # type: ignore[attr-defined]
    for i, events in enumerate(await asyncio.gather(*(collect(run) for run in runs))):
        assert f"output='{i}" in repr(events[-1])


async def test_a_link_in_the_framed_sockets_place_is_not_followed(agent: tuple[GrpcSandboxAgent, Path]) -> None:
    # The socket's dir is the sandbox's too: a hostile agent may leave a symlink there, to a socket of the host.
    client, root = agent
    decoy_dir = short_tmp()
    reached: list[bytes] = []

    async def decoy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.append(await reader.read(64))
        writer.close()

    server = await asyncio.start_unix_server(decoy, str(decoy_dir / "host.sock"))
    try:
        (root / "frames.sock").unlink()
        (root / "frames.sock").symlink_to(decoy_dir / "host.sock")
        events = await collect(await client.run_builtin(bash("echo not-followed")))
        assert "not-followed" in repr(events[-1])
        assert client._tool_stream is not None
        assert not isinstance(client._tool_stream._call, FramedStreamCall)
        await asyncio.sleep(0.1)
        assert reached == []
    finally:
        server.close()
        shutil.rmtree(decoy_dir, ignore_errors=True)


async def test_an_agent_whose_framed_socket_cannot_be_bound_serves_grpc() -> None:
    # Beside an agent socket path just under the Unix limit (107 bytes), frames.sock's is one byte over.
    root = short_tmp()
    long_dir = root / ("d" * (96 - len(str(root)) - 1))
    long_dir.mkdir()
    (root / "ws").mkdir()
    config = AgentConfig(socket_path=str(long_dir / "agent.sock"), workspace=str(root / "ws"), tool_uid=-1,
                         tool_home=str(root / "home"))
    assert (len(config.socket_path), len(frames_path(config.socket_path))) == (107, 108)
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.ensure_future(serve(config, ready, stop))
    await asyncio.wait([server, asyncio.ensure_future(ready.wait())], timeout=30,
                       return_when=asyncio.FIRST_COMPLETED)
    assert not server.done(), server.exception()
    client = GrpcSandboxAgent(f"unix:{config.socket_path}", "sbx")
    try:
        events = await collect(await client.run_builtin(bash("echo grpc-only")))
        assert "grpc-only" in repr(events[-1])
        assert client._tool_stream is not None
        assert not isinstance(client._tool_stream._call, FramedStreamCall)
    finally:
        await client.close()
        stop.set()
        await server
        shutil.rmtree(root, ignore_errors=True)


Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _events_from(reply: Reply) -> list[agent_pb2.RunToolsEvent]:
    """What a FramedStreamCall reads from a fake agent that answers its OPEN and first request with `reply`."""
    root = short_tmp()
    path = str(root / "frames.sock")

    async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header = HEADER.unpack(await reader.readexactly(HEADER.size))
            await reader.readexactly(header[0])
            await reply(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve_one, path)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        outbox: asyncio.Queue[object] = asyncio.Queue()
        outbox.put_nowait(agent_pb2.RunToolsRequest(call=1))
        call = FramedStreamCall(reader, writer, "RunTools", drain(outbox, agent_pb2.RunToolsRequest),
                                agent_pb2.RunToolsEvent)
        try:
            return [event async for event in call]
        finally:
            call.cancel()
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_an_agents_status_frame_is_the_grpc_status_it_names() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(MESSAGE, agent_pb2.RunToolsEvent(call=1, done=True).SerializeToString()))
        writer.write(frame(STATUS, b"FAILED_PRECONDITION\nno such call"))
        await writer.drain()

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _events_from(reply)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.details() == "no such call"


INTERNAL, UNAVAILABLE = {grpc.StatusCode.INTERNAL}, {grpc.StatusCode.UNAVAILABLE}
EXHAUSTED = {grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.mark.parametrize(("sent", "codes"), [
    (struct.pack("!IB", MAX_PAYLOAD + 1, MESSAGE), EXHAUSTED),  # an oversized frame is not read, as gRPC's limit
    (struct.pack("!IB", 3, 9) + b"abc", INTERNAL),  # an unknown kind
    (frame(OPEN, b"RunTools"), INTERNAL),  # a kind that has no place on the way down
    (frame(MESSAGE, b"\xff\xff\xff"), INTERNAL),  # an event that does not parse
    # The stream ends inside a frame: the agent went away mid-write, a lost stream as with gRPC.
    (struct.pack("!IB", 100, MESSAGE) + b"short", UNAVAILABLE),
    (b"", UNAVAILABLE),  # closed without a status
])
async def test_what_a_hostile_agent_sends_ends_the_stream_with_an_error(sent: bytes,
                                                                       codes: set[grpc.StatusCode]) -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sent)
        await writer.drain()
        writer.close()

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _events_from(reply)
    assert raised.value.code() in codes


async def test_a_broken_stream_fails_its_calls_as_a_broken_grpc_stream_does() -> None:
    root = short_tmp()
    path = root / "frames.sock"

    async def hostile(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(HEADER.size)
        writer.write(struct.pack("!IB", MAX_PAYLOAD + 1, MESSAGE))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(hostile, str(path))
    client = GrpcSandboxAgent(f"unix:{root / 'agent.sock'}", "sbx")
    try:
        run = await client.run_builtin(bash("echo hi"))
        with pytest.raises(ResourceExhaustedError):  # as gRPC's limit: the call failed, not the sandbox
            await collect(run)
    finally:
        await client.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_a_client_that_breaks_the_format_is_dropped_and_the_agent_serves_on(
        agent: tuple[GrpcSandboxAgent, Path]) -> None:
    client, root = agent
    for garbage in (frame(MESSAGE, b"x"), frame(OPEN, b"NoSuchMethod"), struct.pack("!IB", MAX_PAYLOAD + 1, OPEN)):
        reader, writer = await asyncio.open_unix_connection(str(root / "frames.sock"))
        writer.write(garbage)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
        writer.close()
    reader, writer = await asyncio.open_unix_connection(str(root / "frames.sock"))
    writer.write(frame(OPEN, b"RunTools") + frame(MESSAGE, b"\xff\xff"))  # a request that does not parse
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    events = await collect(await client.run_builtin(bash("echo still-serving")))
    assert "still-serving" in repr(events[-1])


def test_the_framed_socket_sits_beside_the_agents_socket() -> None:
    assert frames_path("/run/agent/agent.sock") == "/run/agent/frames.sock"
    assert SharedStreams("unix:/x/agent.sock")._framed._path == "/x/frames.sock"
    assert SharedStreams("127.0.0.1:5000")._framed._absent  # not a Unix socket: gRPC only


async def test_a_flood_of_small_frames_does_not_hold_the_planes_loop() -> None:
    # Frames already buffered are read without waiting: an agent sending many small ones would keep the plane's
    # loop, which serves every tenant, to itself. The reader gives the loop a turn every few frames.
    flood = 20_000
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size, _ = HEADER.unpack(await reader.readexactly(HEADER.size))
        await reader.readexactly(size)  # the request: read, so that closing resets nothing
        writer.write(frame(MESSAGE, b"") * flood + frame(STATUS, b"FAILED_PRECONDITION\nend"))
        await writer.drain()
        await reader.read()  # until the plane closes its end

    other = asyncio.ensure_future(ticker())
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _events_from(reply)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # every frame was read, to the status
    finally:
        stop.set()
        await other
    assert ticks >= flood // YIELD_EVERY // 2


async def test_a_request_over_the_frame_limit_fails_the_stream_as_grpcs_limit_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_frames, "MAX_PAYLOAD", 1000)

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # the plane closes its end instead of sending the oversized request

    root = short_tmp()
    path = str(root / "frames.sock")

    async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reply(reader, writer)
        writer.close()

    server = await asyncio.start_unix_server(serve_one, path)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        outbox: asyncio.Queue[object] = asyncio.Queue()
        outbox.put_nowait(agent_pb2.RunToolsRequest(call=1, trace={"traceparent": "x" * 2000}))
        call = FramedStreamCall(reader, writer, "RunTools", drain(outbox, agent_pb2.RunToolsRequest),
                                agent_pb2.RunToolsEvent)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            _ = [event async for event in call]
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        call.cancel()
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)
