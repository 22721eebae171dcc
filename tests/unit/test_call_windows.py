"""The control plane's per-call windows on a shared stream (controlplane/sandbox/call_windows.py): the plane grants
a call more room only as its consumer takes events, and an agent that sends past a call's window (a compromised
one) fails that call at once, without holding the plane's memory or the stream's other calls. The agent here is a
scripted stream: exactly what a hostile agent could send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.core.seam.messages import Output
from controlplane.errors import SandboxError
from controlplane.sandbox.agent_client import StreamedExec
from controlplane.sandbox.agent_streams import SharedStream
from controlplane.sandbox.call_windows import GRANT_EVERY, SLACK, WINDOW
from controlplane.telemetry.remote import AgentCallSpan
from sandbox.v1 import agent_pb2
from sandbox_agent.output_credit import charge
from sandbox_agent.stdin_credit import FEATURES

CHUNK = 64 * 1024


class ScriptedAgent:
    """The agent's end of an ExecMany stream: the events the test puts, as fast as the plane reads them."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.events.put_nowait(agent_pb2.ExecManyEvent(features=FEATURES))  # as an agent of this version starts
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _events(self) -> AsyncIterator[Any]:
        while True:
            yield await self.events.get()

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def output(self, call: int, size: int = CHUNK) -> agent_pb2.ExecManyEvent:
        event = agent_pb2.ExecManyEvent(call=call)
        event.event.output.stdout = b"x" * size
        self.events.put_nowait(event)
        return event


def requests_sent(outbox: asyncio.Queue[object]) -> list[agent_pb2.ExecManyRequest]:
    sent = []
    while not outbox.empty():
        item = outbox.get_nowait()
        assert isinstance(item, agent_pb2.ExecManyRequest)
        sent.append(item)
    return sent


def new_stream() -> tuple[ScriptedAgent, SharedStream, asyncio.Queue[object]]:
    agent = ScriptedAgent()
    outbox: asyncio.Queue[object] = asyncio.Queue()
    return agent, SharedStream(agent, outbox, agent_pb2.ExecManyRequest), outbox


def command(stream: SharedStream) -> StreamedExec:
    start = agent_pb2.ExecRequest(start=agent_pb2.ExecStart(argv=["yes"]))
    return StreamedExec(stream, start, "sbx-flow", AgentCallSpan("Exec", "sbx-flow"))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_call_starts_with_a_window_and_gets_more_only_as_its_events_are_taken() -> None:
    agent, stream, outbox = new_stream()
    call = command(stream)
    (start,) = requests_sent(outbox)
    assert start.HasField("request")
    assert start.credit == WINDOW
    sent = [agent.output(1) for _ in range(12)]
    await settle()
    assert requests_sent(outbox) == []  # nothing taken, nothing granted
    events = call.events()
    taken = [await anext(events) for _ in range(12)]
    assert all(isinstance(e, Output) and len(e.data) == CHUNK for e in taken)
    grants = requests_sent(outbox)
    assert grants
    assert all(not g.HasField("request") and not g.cancel and g.call == 1 for g in grants)
    assert all(g.credit >= GRANT_EVERY for g in grants)
    # The last event handed out is granted back only when the consumer comes back for more.
    assert sum(g.credit for g in grants) <= sum(charge(e) for e in sent[:11])
    agent.output(1)
    await anext(events)
    assert sum(g.credit for g in requests_sent(outbox) + grants) <= sum(charge(e) for e in sent)
    await events.aclose()  # type: ignore[attr-defined]
    stream.close()


async def test_an_agent_sending_past_the_window_fails_that_call_naming_the_sandbox() -> None:
    agent, stream, outbox = new_stream()
    flooded, other = command(stream), command(stream)
    requests_sent(outbox)
    for _ in range((WINDOW + SLACK) // CHUNK + 2):  # the consumer takes nothing: an agent ignoring the window
        agent.output(1)
    agent.output(2, 10)
    await settle()
    assert stream._inboxes.keys() == {2}  # the flooded call's queued events are dropped at once
    assert [(r.call, r.cancel) for r in requests_sent(outbox)] == [(1, True)]
    for _ in range(50):  # what the agent sends on for it is not held either
        agent.output(1)
    await settle()
    assert agent.events.empty()
    assert stream._inboxes.keys() == {2}
    with pytest.raises(SandboxError, match=r"sandbox sbx-flow.s agent.*past its window"):
        await anext(flooded.events())
    # The stream and the sandbox's other calls go on.
    assert stream.open
    assert not agent.cancelled
    assert isinstance(event := await anext(other.events()), Output)
    assert event.data == b"x" * 10
    stream.close()


async def test_an_exec_event_bigger_than_any_honest_one_fails_the_call() -> None:
    agent, stream, _outbox = new_stream()
    call = command(stream)
    agent.output(1, 2 * WINDOW)
    await settle()
    with pytest.raises(SandboxError, match="sbx-flow"):
        await anext(call.events())
    assert stream.open
    assert 1 not in stream._inboxes
    stream.close()


async def test_an_honest_agent_within_its_window_is_never_failed() -> None:
    # What the agent may send: events while fewer than WINDOW bytes are out, the last one ending past it.
    agent, stream, _outbox = new_stream()
    call = command(stream)
    out = 0
    while out < WINDOW:
        out += charge(agent.output(1))
    await settle()
    assert stream._windows[1].queued == out
    events = call.events()
    while not agent.events.empty() or not stream._inboxes[1].empty():
        await anext(events)
    await events.aclose()  # type: ignore[attr-defined]
    stream.close()


async def test_a_tool_result_bigger_than_the_window_is_taken_on_the_tool_stream() -> None:
    # A tool's result may be bigger than the window (the agent never splits an event): it is sent while the
    # window still has room, and the plane takes it whole.
    agent = ScriptedAgent()
    outbox: asyncio.Queue[object] = asyncio.Queue()
    stream = SharedStream(agent, outbox, agent_pb2.RunToolsRequest)
    number, inbox = stream.start(agent_pb2.RunToolRequest(start=agent_pb2.ToolStart(tool="read")),
                                 AgentCallSpan("RunTool", "sbx-flow"))
    metadata = agent_pb2.RunToolsEvent(call=number)
    metadata.event.metadata.title = "m" * (WINDOW - 1024)
    result = agent_pb2.RunToolsEvent(call=number, done=True)
    result.event.result.output = "r" * (8 * WINDOW)
    agent.events.put_nowait(metadata)
    agent.events.put_nowait(result)
    await settle()
    assert [inbox.get_nowait(), inbox.get_nowait()] == [metadata, result]
    assert stream._windows[number].queued == charge(metadata) + charge(result)
    stream.close()
