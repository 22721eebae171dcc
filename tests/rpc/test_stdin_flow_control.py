"""Flow control of a command's stdin (controlplane/sandbox/stdin_windows.py, sandbox_agent/stdin_credit.py), with
the real agent: a client streaming into a command that does not read is held by gRPC's own flow control once the
call's window is used up (the plane holds at most the window, the agent no more), what a command reads arrives
whole and in order, an abort reaches a command whose stdin is stalled, and an agent that never credits stalls
only its own call. The local plane runs here: its RSS is what is measured."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import grpc
import pytest

from controlplane.core.seam.messages import CommandSpec, Exited, Output, Started
from controlplane.sandbox.stdin_windows import STDIN_WINDOW
from controlplane.v1 import sandbox_pb2
from sandbox.v1 import agent_pb2
from sandbox_agent import server
from sandbox_agent.multiplex import multiplex
from sandbox_agent.output_credit import Credits
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


async def test_an_agent_of_an_older_image_serves_honest_calls_without_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    # An image from before the hello: it names no flow control, credits no stdin and ignores output windows.
    def without_hello(*args: Any, hello: object = None, **kwargs: Any) -> AsyncIterator[Any]:
        return multiplex(*args, **kwargs)

    def uncredited(requests: AsyncIterator[agent_pb2.ExecRequest], execution: Stdin,
                   credit: Callable[[int], None]) -> Coroutine[None, None, None]:
        return feed(requests, execution, lambda _size: None)

    opened = Credits.open
    monkeypatch.setattr(server, "multiplex", without_hello)
    monkeypatch.setattr(server, "feed", uncredited, raising=False)
    monkeypatch.setattr(Credits, "open", lambda self, call, window: opened(self, call, 0))
    data = bytes(range(256)) * (32 * MIB // 256)
    async with local_agent("a.sock") as (client, _, _root):
        stream = await client.exec(CommandSpec(argv=["cat"], stdin=True))
        for at in range(0, len(data), MIB):  # all of it before any output is read: nothing waits for credit
            await asyncio.wait_for(stream.write_stdin(data[at:at + MIB]), 5)
        await stream.close_stdin()
        await asyncio.sleep(1)  # its output piles up unread: on main, past the window, the call was failed
        out, exited = bytearray(), None
        async for event in stream.events():
            if isinstance(event, Output):
                out += event.data
            elif isinstance(event, Exited):
                exited = event
        assert exited is not None
        assert exited.exit_code == 0
        assert bytes(out) == data
        shared = client._exec_stream
        assert shared is not None
        assert shared.features == frozenset()
