"""Flow control of a command's stdin (controlplane/sandbox/stdin_windows.py, sandbox_agent/stdin_credit.py), with
the real agent: a client streaming into a command that does not read is held by gRPC's own flow control once the
call's window is used up (the plane holds at most the window, the agent no more), what a command reads arrives
whole and in order, an abort reaches a command whose stdin is stalled, an agent that never credits stalls only its
own call, one that neither credits nor reads its requests costs the plane no more, and an agent naming no flow
control (an older image) is refused with what to do (controlplane/sandbox/agent_protocol.py). The local plane runs
here: its RSS is what is measured."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import pytest

from controlplane.core.seam.messages import CommandSpec, Exited, Started
from controlplane.errors import AgentProtocolError
from controlplane.sandbox.stdin_windows import STDIN_WINDOW
from controlplane.v1 import sandbox_pb2
from sandbox.v1 import agent_pb2
from sandbox_agent import server, tool_calls
from sandbox_agent.multiplex import multiplex, routed
from sandbox_agent.stdin_credit import Stdin, feed
from tests.local_agent import local_agent
from tests.plane_memory import rss_mib
from tests.planes import Plane

MIB = 1 << 20
AHEAD_MIB = 32
"""What a client may get ahead of a command that does not read: the window, and gRPC's own buffers on the way
(on main the plane took all it was sent: hundreds of MiB a second)."""
GROWTH_MIB = 96



class Flood:
    """A client's stdin of up to 2 GiB of 1 MiB messages. Past `cap` it stops sending (the test has failed by then):
    on main the plane would take all 2 GiB into its memory."""

    def __init__(self, total: int = 2 << 30, cap: int = 256 * MIB, data: Callable[[int], bytes] | None = None) -> None:
        self.sent = 0
        self._total, self._cap = total, cap
        self._data = data or (lambda _: b"z" * MIB)

    async def __call__(self) -> AsyncIterator[bytes]:
        index = 0
        while self.sent < self._total:
            if self.sent >= self._cap:
                await asyncio.sleep(3600)
            chunk = self._data(index)[: self._total - self.sent]
            index += 1
            self.sent += len(chunk)
            yield chunk


async def started_pid(call: grpc.aio.StreamStreamCall[sandbox_pb2.ExecRequest, sandbox_pb2.ExecEvent]) -> int:
    first = await anext(aiter(call))
    assert first.WhichOneof("event") == "started_pid"
    return int(first.started_pid)


async def test_a_client_streaming_into_a_command_that_does_not_read_is_held_by_the_window(local_plane: Plane) -> None:
    session = await local_plane.client.create_session()
    flood = Flood()
    before = peak = rss_mib()
    call = local_plane.client.exec_call(session.id, ["sleep", "600"], stdin=flood())
    try:
        await started_pid(call)
        for _ in range(8):  # four seconds: on main the plane had taken the cap's 256 MiB well before
            await asyncio.sleep(0.5)
            peak = max(peak, rss_mib())
        assert flood.sent < AHEAD_MIB * MIB, f"the client got {flood.sent >> 20} MiB ahead of a command not reading"
        assert peak - before < GROWTH_MIB, f"the plane grew by {peak - before} MiB"
        # The session's other calls go on meanwhile.
        ok = await asyncio.wait_for(local_plane.client.run(session.id, ["echo", "ok"]), 10)
        assert ok.stdout == b"ok\n"
    finally:
        call.cancel()
        await local_plane.client.delete_session(session.id)


async def test_stdin_a_command_reads_late_arrives_whole_and_in_order(local_plane: Plane) -> None:
    size = 50 * MIB
    pieces = [hashlib.sha256(str(i).encode()).digest() * (MIB // 32) for i in range(size // MIB)]
    expected = hashlib.sha256(b"".join(pieces)).hexdigest()
    flood = Flood(total=size, data=lambda i: pieces[i])
    session = await local_plane.client.create_session()
    try:
        # The command reads nothing for 3 s, then all of it: meanwhile the client is held near the window.
        call = local_plane.client.exec_call(
            session.id, command="sleep 3; cat > big.bin && sha256sum big.bin && rm big.bin", stdin=flood(),
            timeout_ms=120_000)
        events = aiter(call)
        assert (await anext(events)).WhichOneof("event") == "started_pid"
        await asyncio.sleep(2)
        assert flood.sent < AHEAD_MIB * MIB, f"the client got {flood.sent >> 20} MiB ahead"  # on main: all 50
        out, exited = b"", None
        async for event in events:
            if event.WhichOneof("event") == "stdout":
                out += event.stdout
            elif event.WhichOneof("event") == "exited":
                exited = event.exited
                break
        assert exited is not None
        assert exited.exit_code == 0, exited
        assert out.split()[0].decode() == expected
    finally:
        await local_plane.client.delete_session(session.id)


async def test_an_agent_that_never_credits_stalls_only_its_own_call(local_plane: Plane,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A compromised agent: it writes each call's stdin but never says so.
    def silent(requests: AsyncIterator[agent_pb2.ExecRequest], execution: Stdin,
               credit: Callable[[int], None]) -> Coroutine[None, None, None]:
        return feed(requests, execution, lambda _size: None)

    monkeypatch.setattr(server, "feed", silent, raising=False)
    session = await local_plane.client.create_session()
    flood = Flood()
    stalled = local_plane.client.exec_call(session.id, ["sleep", "600"], stdin=flood())
    try:
        await started_pid(stalled)
        await asyncio.sleep(2)
        assert flood.sent < AHEAD_MIB * MIB, f"the client got {flood.sent >> 20} MiB ahead"
        began = time.monotonic()

        async def some() -> AsyncIterator[bytes]:
            yield b"still "
            yield b"serving"

        other = await asyncio.wait_for(local_plane.client.run(session.id, ["cat"], stdin=some()), 10)
        assert other.stdout == b"still serving"
        assert time.monotonic() - began < 5
    finally:
        stalled.cancel()
        await local_plane.client.delete_session(session.id)


async def test_an_abort_reaches_a_command_whose_stdin_is_stalled() -> None:
    async with local_agent("a.sock") as (client, _, _root):
        stream = await client.exec(CommandSpec(argv=["sleep", "600"], stdin=True))
        events = stream.events()
        assert isinstance(await anext(events), Started)

        async def flood() -> None:
            for _ in range(64):  # on main the plane queued all 64 MiB, the agent wrote till the pipe was full
                await stream.write_stdin(b"z" * MIB)

        writer = asyncio.ensure_future(flood())
        await asyncio.sleep(1)
        shared = client._exec_stream
        assert shared is not None
        (window,) = shared._stdin.values()
        assert window.outstanding <= STDIN_WINDOW + MIB + 1024  # what the agent was sent and did not write
        assert not writer.done()
        await stream.abort("enough")
        exited = await asyncio.wait_for(anext(events), 10)  # on main: the abort waited behind the stdin for good
        assert isinstance(exited, Exited)
        assert exited.aborted
        await asyncio.wait_for(writer, 5)  # the call is over: the writer is let go
        with contextlib.suppress(StopAsyncIteration):
            await anext(events)


def without_hello(*args: Any, hello: object = None, **kwargs: Any) -> AsyncIterator[Any]:
    """The agent's shared streams as an image from before the hello serves them: no first message naming windows."""
    return multiplex(*args, **kwargs)


def deaf(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A compromised agent's reading of its ExecMany stream: the first request (a call's start), then nothing more."""
    async def first_only() -> AsyncIterator[Any]:
        async for request in routed(requests):
            yield request
            await asyncio.Event().wait()

    return first_only()


@pytest.mark.parametrize("names", ["both windows", "nothing"])
async def test_an_agent_that_neither_credits_nor_reads_its_requests_leaves_the_plane_a_window(
        local_plane: Plane, monkeypatch: pytest.MonkeyPatch, names: str) -> None:
    # Issue 22: on main an agent naming nothing on its stream (as an older image) was held to no stdin window, and one
    # that also stopped reading left all of a client's stdin in the plane's outbox to it. Claiming the windows, it is
    # held to them; naming none, its calls are refused.
    monkeypatch.setattr(server, "routed", deaf)
    monkeypatch.setattr(server, "feed", lambda requests, execution, credit: feed(requests, execution, lambda _: None))
    if names == "nothing":
        monkeypatch.setattr(server, "multiplex", without_hello)
    session = await local_plane.client.create_session()
    flood = Flood()
    before = peak = rss_mib()
    call = local_plane.client.exec_call(session.id, ["sleep", "600"], stdin=flood())
    refused: grpc.aio.AioRpcError | None = None
    try:
        try:
            await asyncio.wait_for(started_pid(call), 10)
        except grpc.aio.AioRpcError as exc:
            refused = exc
        for _ in range(8):  # four seconds: on main the plane had taken the cap's 256 MiB well before
            await asyncio.sleep(0.5)
            peak = max(peak, rss_mib())
        assert flood.sent < AHEAD_MIB * MIB, f"the client got {flood.sent >> 20} MiB ahead of an agent not reading"
        assert peak - before < GROWTH_MIB, f"the plane grew by {peak - before} MiB"
        if names == "nothing":
            assert refused is not None, "an agent naming no flow control was served"
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "older than this control plane" in (refused.details() or "")
        else:
            assert refused is None
    finally:
        call.cancel()
        await local_plane.client.delete_session(session.id)


async def test_a_sandbox_whose_agent_names_no_flow_control_is_refused_at_its_start(
        local_plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    # An older image's agent: Health without `flow_control`, streams without the hello.
    monkeypatch.setattr(server, "FEATURES", ())
    monkeypatch.setattr(tool_calls, "FEATURES", ())
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await local_plane.client.create_session()  # on main: a session, served without windows
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, raised.value
    details = raised.value.details() or ""
    assert "older than this control plane" in details
    assert "FROM the current ocsb-sandbox image" in details


async def test_an_agent_naming_no_flow_control_is_refused_by_its_client(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plane's side of an older image's agent: Health says nothing of windows, nor do the streams.
    monkeypatch.setattr(server, "FEATURES", ())
    monkeypatch.setattr(tool_calls, "FEATURES", ())
    async with local_agent("a.sock") as (client, _, _root):
        with pytest.raises(AgentProtocolError, match="Health names no flow control, not output-credit and stdin"):
            await client.health()  # on main: healthy
        stream = await client.exec(CommandSpec(argv=["cat"], stdin=True))
        with pytest.raises(AgentProtocolError, match="first message on a shared stream names no flow control"):
            await asyncio.wait_for(anext(stream.events()), 5)  # on main: served without windows
        shared = client._exec_stream
        assert shared is not None
        assert not shared.open
