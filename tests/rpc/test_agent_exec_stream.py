"""Commands on the agent's ExecMany stream: each with its own events, stdin, abort and errors (in-process agent)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from controlplane.core.seam.messages import CommandSpec, ExecEvent, Exited, Output, Started
from controlplane.core.seam.provider import ExecStream
from controlplane.errors import FailedPreconditionError, SandboxLostError
from controlplane.sandbox.agent_client import GrpcSandboxAgent, StreamedExec
from tests.rpc.test_agent_tool_stream import Agent, _sleeping, agent

__all__ = ["agent"]  # the fixture, shared with the RunTools tests


async def collect(stream: ExecStream) -> list[ExecEvent]:
    return [event async for event in stream.events()]


def stdout_of(events: list[ExecEvent]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, Output) and e.stream == "stdout")


async def test_commands_share_one_stream(agent: Agent) -> None:
    client, _, _ = agent
    first = await client.exec(CommandSpec(argv=["echo", "first"]))  # no Health needed first
    assert stdout_of(await collect(first)) == b"first\n"
    streams = [await client.exec(CommandSpec(command=f"echo {i}; sleep 0.0{i}; echo err{i} >&2; exit {i}"))
               for i in range(8)]
    assert all(isinstance(stream, StreamedExec) for stream in streams)
    assert len({id(stream._stream) for stream in [first, *streams] if isinstance(stream, StreamedExec)}) == 1
    results = await asyncio.gather(*(collect(stream) for stream in streams))
    for i, events in enumerate(results):
        assert isinstance(events[0], Started)
        assert stdout_of(events) == f"{i}\n".encode()
        assert [e.data for e in events if isinstance(e, Output) and e.stream == "stderr"] == [f"err{i}\n".encode()]
        end = events[-1]
        assert isinstance(end, Exited)
        assert (end.exit_code, end.aborted, end.timed_out) == (i, False, False)


async def test_stdin_abort_and_refusals_travel_per_command(agent: Agent) -> None:
    client, _, _ = agent
    cat = await client.exec(CommandSpec(argv=["cat"], stdin=True))
    await cat.write_stdin(b"through the shared stream\n")
    await cat.close_stdin()
    assert stdout_of(await collect(cat)) == b"through the shared stream\n"

    sleeper = await client.exec(CommandSpec(argv=["sleep", "30"]))
    events = sleeper.events()
    assert isinstance(await anext(events), Started)
    await sleeper.abort("enough")
    end = [e async for e in events][-1]
    assert isinstance(end, Exited)
    assert (end.aborted, end.abort_reason) == (True, "enough")

    missing = await client.exec(CommandSpec(argv=["/nonexistent/program"]))
    with pytest.raises(FailedPreconditionError, match="cannot run '/nonexistent/program': no such file"):
        await collect(missing)
    after = await client.exec(CommandSpec(argv=["echo", "after"]))  # the stream still serves new commands
    assert stdout_of(await collect(after)) == b"after\n"


async def test_cancelling_one_command_kills_it_and_spares_the_others(agent: Agent) -> None:
    client, _, workspace = agent
    marker = workspace / "slept"
    doomed = await client.exec(CommandSpec(command=f"echo started; sleep 31; touch {marker}"))
    kept = await client.exec(CommandSpec(command="sleep 0.3; echo kept"))
    seen = doomed.events()
    assert isinstance(seen, AsyncGenerator)
    async for event in seen:
        if isinstance(event, Output) and b"started" in event.data:
            break
    doomed.cancel()
    await seen.aclose()
    assert stdout_of(await collect(kept)) == b"kept\n"
    for _ in range(200):
        if not _sleeping("sleep 31"):
            break
        await asyncio.sleep(0.02)
    assert not _sleeping("sleep 31")
    assert not marker.exists()


async def test_an_agent_shutting_down_ends_every_command_then_the_stream_is_lost(agent: Agent) -> None:
    client, stop, _ = agent
    streams = [await client.exec(CommandSpec(argv=["sleep", "5"])) for _ in range(3)]
    iterators = [stream.events() for stream in streams]
    for events in iterators:
        assert isinstance(await anext(events), Started)
    stop.set()  # the agent stops its commands, then its server goes away
    for events in iterators:
        end = [e async for e in events][-1]
        assert isinstance(end, Exited)
        assert (end.aborted, end.abort_reason) == (True, "agent shutting down")
    with pytest.raises(SandboxLostError):  # once the server is gone (it lets open streams finish first)
        await _until_refused(client)


async def _until_refused(client: GrpcSandboxAgent) -> None:
    for _ in range(100):
        await collect(await client.exec(CommandSpec(argv=["true"])))
        await asyncio.sleep(0.05)
