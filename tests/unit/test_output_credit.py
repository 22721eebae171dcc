"""The agent's side of per-call flow control (sandbox_agent/output_credit.py, in multiplex): a call whose window is
used up is not read further (its command then blocks on write) until the control plane grants more; a call of an
older plane (no window) is not limited; a hung-up call never waits for a grant that will not come."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from sandbox.v1 import agent_pb2
from sandbox_agent.multiplex import Routed, is_start, multiplex
from sandbox_agent.output_credit import charge

CHUNK = 64 * 1024
WINDOW = 1 << 20
START = agent_pb2.ExecRequest(start=agent_pb2.ExecStart(argv=["yes"]))


def wrap(call: int, event: Any = None, done: bool = False, error: str = "", code: str = "") -> Any:
    return agent_pb2.ExecManyEvent(call=call, event=event, done=done, error=error, code=code)


class Loud:
    """A command writing without end: counts the chunks taken from it (what its pipe was read of)."""

    def __init__(self) -> None:
        self.pulled = 0
        self.finished = asyncio.Event()

    async def run(self, requests: AsyncIterator[Any], trace: dict[str, str]) -> AsyncIterator[Any]:
        try:
            while True:
                self.pulled += 1
                event = agent_pb2.ExecEvent(seq=self.pulled)
                event.output.stdout = b"x" * CHUNK
                yield event
        finally:
            self.finished.set()


class Reader:
    """Reads the shared stream as fast as it comes (as the plane's reader does), into a list."""

    def __init__(self, events: AsyncIterator[Any]) -> None:
        self._events = events
        self._got: list[Any] = []
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for event in self._events:
            self._got.append(event)

    async def new(self, quiet: float = 0.3) -> list[Any]:
        """What arrived until nothing did for `quiet` seconds."""
        seen = -1
        while seen != len(self._got):
            seen = len(self._got)
            await asyncio.sleep(quiet)
        got, self._got = self._got, []
        return got

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_a_call_stops_at_its_window_and_goes_on_as_credit_comes() -> None:
    requests: asyncio.Queue[Routed[Any]] = asyncio.Queue()
    loud = Loud()

    async def routed() -> AsyncIterator[Routed[Any]]:
        while True:
            yield await requests.get()

    keep: set[asyncio.Task[Any]] = set()
    events = Reader(multiplex(routed(), is_start, loud.run, wrap, keep, cancel_on_hang_up=True,
                              is_final=lambda e: False))
    requests.put_nowait(Routed(1, START, {}, WINDOW))
    first = await events.new()
    sent = sum(charge(e) for e in first)
    assert WINDOW <= sent < WINDOW + 2 * CHUNK  # up to the window, the last event ending past it
    assert loud.pulled <= len(first) + 1  # the command's output was not read on: it blocks on write
    assert await events.new() == []
    requests.put_nowait(Routed(1, None, {}, 4 * CHUNK))  # the plane's consumer took some: as much again flows
    more = await events.new()
    assert 3 <= len(more) <= 5
    requests.put_nowait(Routed(1, None, {}))  # hung up while out of credit: the call ends, nothing waits on
    await events.new()
    await asyncio.wait_for(loud.finished.wait(), 5)
    await events.close()


async def test_a_call_of_a_plane_granting_no_window_is_not_limited() -> None:
    requests: asyncio.Queue[Routed[Any]] = asyncio.Queue()
    loud = Loud()

    async def routed() -> AsyncIterator[Routed[Any]]:
        while True:
            yield await requests.get()

    events = multiplex(routed(), is_start, loud.run, wrap, set(), cancel_on_hang_up=True, is_final=lambda e: False)
    requests.put_nowait(Routed(1, START, {}))
    got = [await anext(events) for _ in range(64)]  # 4 MiB: four windows' worth, with no grant
    assert sum(charge(e) for e in got) > 4 * WINDOW
    await events.aclose()  # type: ignore[attr-defined]


async def test_a_hung_up_tool_call_out_of_credit_still_ends() -> None:
    # RunTools hangs a call up by ending its requests (cancel_on_hang_up=False): the call must then run to its
    # end, which it could not while waiting for a grant nobody will send.
    requests: asyncio.Queue[Routed[Any]] = asyncio.Queue()
    ended = asyncio.Event()

    async def run(call_requests: AsyncIterator[Any], trace: dict[str, str]) -> AsyncIterator[Any]:
        await anext(call_requests)  # its start
        aborted = asyncio.ensure_future(anext(call_requests, None))
        while not aborted.done():
            event = agent_pb2.ExecEvent()
            event.output.stdout = b"y" * CHUNK
            yield event
            await asyncio.sleep(0)
        ended.set()

    async def routed() -> AsyncIterator[Routed[Any]]:
        while True:
            yield await requests.get()

    keep: set[asyncio.Task[Any]] = set()
    events = multiplex(routed(), is_start, run, wrap, keep, cancel_on_hang_up=False, is_final=lambda e: False)
    reader = Reader(events)
    requests.put_nowait(Routed(7, START, {}, WINDOW))
    assert await reader.new()
    requests.put_nowait(Routed(7, None, {}))
    await reader.new()
    await asyncio.wait_for(ended.wait(), 5)
    await reader.close()
    assert not keep
