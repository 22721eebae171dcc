"""The control plane's stdin windows on the shared ExecMany stream (controlplane/sandbox/stdin_windows.py): a writer
waits once a call has a window of stdin the agent has not credited, goes on as credit comes, and is released at
once when its call ends; an agent that never credits stalls only its own call; a stream whose agent does not name
both windows first (an older image, or a hostile agent saying nothing) fails its calls with what to do about it
(agent_protocol.py). The agent here is a scripted stream: exactly what a hostile (or an old) agent could send."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.calls.output_budget import OutputBudget, drawing_from
from controlplane.core.seam.messages import Output
from controlplane.errors import AgentProtocolError
from controlplane.sandbox.agent_client import StreamedExec
from controlplane.sandbox.agent_protocol import REQUIRED
from controlplane.sandbox.agent_streams import SharedStream
from controlplane.sandbox.stdin_windows import STDIN_WINDOW, StdinWindow
from sandbox.v1 import agent_pb2
from sandbox_agent.stdin_credit import FEATURES, stdin_cost
from tests.unit.test_call_windows import ScriptedAgent, command, new_stream, requests_sent, settle

CHUNK = 64 * 1024
MIB = 1 << 20


def stdin_sent(outbox: asyncio.Queue[object], call: int) -> list[bytes]:
    return [r.request.stdin for r in requests_sent(outbox) if r.call == call and r.request.WhichOneof("msg") == "stdin"]


FLOOD = 4 * STDIN_WINDOW // CHUNK


async def fill(call: StreamedExec) -> asyncio.Task[None]:
    """A writer streaming 4 windows of stdin into the call, as a client into a command that does not read."""
    async def flood() -> None:
        for _ in range(FLOOD):
            await call.write_stdin(b"s" * CHUNK)
            await asyncio.sleep(0)

    task = asyncio.ensure_future(flood())
    for _ in range(3 * FLOOD):  # time enough to write all four windows, where nothing holds the writer
        await asyncio.sleep(0)
    return task


async def test_a_window_holds_a_writer_until_credit_and_lets_a_message_end_past_it() -> None:
    window = StdinWindow()
    await window.spend(b"x" * (STDIN_WINDOW - 1024))
    await window.spend(b"y" * STDIN_WINDOW)  # room was left: it goes, ending past the window
    waiting = asyncio.ensure_future(window.spend(b"z"))
    await settle()
    assert not waiting.done()
    window.credit(stdin_cost(b"x" * (STDIN_WINDOW - 1024)))
    await settle()
    assert not waiting.done()  # still a window's worth out
    window.credit(1 << 30)  # a hostile agent crediting more than was sent takes nothing below zero
    await asyncio.wait_for(waiting, 1)
    assert window.outstanding == stdin_cost(b"z")
    window.release()
    await asyncio.wait_for(window.spend(b"w" * (4 * STDIN_WINDOW)), 1)
    await asyncio.wait_for(window.spend(b"w"), 1)  # released: never waits again


async def test_stdin_waits_at_the_window_and_goes_on_as_the_agent_credits() -> None:
    agent, stream, outbox = new_stream()
    call = command(stream)
    requests_sent(outbox)
    flood = await fill(call)
    sent = stdin_sent(outbox, 1)
    assert sum(map(stdin_cost, sent)) < STDIN_WINDOW + stdin_cost(b"s" * CHUNK)  # on main: it never waits
    assert not flood.done()
    agent.events.put_nowait(agent_pb2.ExecManyEvent(call=1, stdin_credit=sum(map(stdin_cost, sent[:4]))))
    await settle()
    assert len(stdin_sent(outbox, 1)) == 4  # exactly what was credited goes on
    assert stream.open
    flood.cancel()
    stream.close()


async def test_an_agent_that_never_credits_stalls_only_that_calls_stdin() -> None:
    agent, stream, outbox = new_stream()
    stalled, other = command(stream), command(stream)
    requests_sent(outbox)
    flood = await fill(stalled)
    assert not flood.done()  # on main: nothing held it
    await asyncio.wait_for(other.write_stdin(b"hello"), 1)
    assert stdin_sent(outbox, 2) == [b"hello"]
    agent.output(2, 10)
    assert isinstance(await asyncio.wait_for(anext(other.events()), 1), Output)
    assert not flood.done()
    assert stream.open
    flood.cancel()
    stream.close()


@pytest.mark.parametrize("ending", ["exited", "refused", "cancelled", "stream lost"])
async def test_a_call_that_ends_releases_its_waiting_writer_at_once(ending: str) -> None:
    agent, stream, outbox = new_stream()
    call = command(stream)
    flood = await fill(call)
    assert not flood.done()  # on main: all four windows went straight to the outbox
    requests_sent(outbox)
    if ending == "exited":
        event = agent_pb2.ExecManyEvent(call=1, done=True)
        event.event.exited.exit_code = 0
        agent.events.put_nowait(event)
    elif ending == "refused":
        agent.events.put_nowait(agent_pb2.ExecManyEvent(call=1, done=True, error="refused", code="INVALID_ARGUMENT"))
    elif ending == "cancelled":
        call.cancel()
    else:
        stream._reader.cancel()  # the stream's reader ends as with a lost agent
    await asyncio.wait_for(flood, 1)  # the rest of the writes do not wait: they are dropped
    while not outbox.empty():
        item = outbox.get_nowait()
        assert not (isinstance(item, agent_pb2.ExecManyRequest) and item.request.WhichOneof("msg") == "stdin")
    stream.close()


OLDER_FIRST_MESSAGES = {
    "a call's event": agent_pb2.ExecManyEvent(call=1, event=agent_pb2.ExecEvent(started=agent_pb2.Started(pid=7))),
    "a hello naming nothing": agent_pb2.ExecManyEvent(),
    "a hello without stdin credit": agent_pb2.ExecManyEvent(features=["output-credit"]),
    "a hello without output credit": agent_pb2.ExecManyEvent(features=["stdin-credit", "something-else"]),
}


@pytest.mark.parametrize("first", list(OLDER_FIRST_MESSAGES))
async def test_a_stream_whose_agent_names_less_than_both_windows_fails_its_calls_with_what_to_do(first: str) -> None:
    # An image from before the hello (its first message is a call's event), or a hostile agent saying too little.
    agent = ScriptedAgent()
    agent.events.get_nowait()
    budget = OutputBudget()
    outbox: asyncio.Queue[object] = asyncio.Queue()
    stream = SharedStream(agent, outbox, agent_pb2.ExecManyRequest)
    with drawing_from(budget):
        call = command(stream)
    flood = await fill(call)  # the client's stdin, before the agent said anything: held at the window
    assert not flood.done()
    agent.events.put_nowait(OLDER_FIRST_MESSAGES[first])
    agent.output(1, 10)
    with pytest.raises(AgentProtocolError, match="older than this control plane") as raised:
        await asyncio.wait_for(anext(call.events()), 1)  # on main: served, without windows
    assert "FROM the current ocsb-sandbox image" in str(raised.value)
    assert "sbx-flow" in str(raised.value)
    assert not stream.open
    assert agent.cancelled
    await asyncio.wait_for(flood, 1)  # its writer is let go: what it had left goes nowhere
    up = [outbox.get_nowait() for _ in range(outbox.qsize())]
    sent = [r.request.stdin for r in up if isinstance(r, agent_pb2.ExecManyRequest) and r.request.stdin]
    assert sum(map(stdin_cost, sent)) < STDIN_WINDOW + stdin_cost(b"s" * CHUNK)
    assert budget.used == 0  # the call's share of its tenant's budget went back


async def test_the_plane_requires_what_this_trees_agent_names() -> None:
    assert REQUIRED <= frozenset(FEATURES)  # the image the plane builds is never refused by it


async def test_a_writer_before_the_hello_is_counted_and_the_hello_keeps_it() -> None:
    agent = ScriptedAgent()
    hello = agent.events.get_nowait()
    assert list(hello.features) == list(FEATURES)
    outbox: asyncio.Queue[object] = asyncio.Queue()
    stream = SharedStream(agent, outbox, agent_pb2.ExecManyRequest)
    call = command(stream)
    flood = await fill(call)  # the client's stdin arrives before the agent said anything
    assert not flood.done()
    agent.events.put_nowait(hello)
    await settle()
    assert stream.features == frozenset(FEATURES)
    assert not flood.done()  # still held: the agent honours the window
    flood.cancel()
    stream.close()
