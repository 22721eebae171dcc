"""Tool calls on the agent's RunTools stream: each with its own asks, result, cancel and errors (in-process agent)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane.core.permissions.asks import _snapshot
from controlplane.core.permissions.permission import Rule
from controlplane.core.seam.messages import BuiltinCall, RunAsk, RunEvent, RunFailed, RunMetadata, RunResult
from controlplane.core.seam.provider import BuiltinRun
from controlplane.errors import SandboxLostError
from controlplane.sandbox.agent_client import GrpcSandboxAgent, StreamedBuiltinRun
from controlplane.sandbox.agent_streams import SharedStream
from tests.local_agent import local_agent


@pytest.fixture
async def agent() -> AsyncIterator[tuple[GrpcSandboxAgent, asyncio.Event, Path]]:
    async with local_agent("a.sock") as (client, stop, root):
        yield client, stop, root / "ws"


def bash(command: str, call_id: str = "c") -> BuiltinCall:
    return BuiltinCall(tool="bash", args={"command": command, "description": "d"}, session_id="s", message_id="m",
                       call_id=call_id, agent="build")


async def collect(run: BuiltinRun, allow: bool = True) -> list[RunEvent]:
    events: list[RunEvent] = []
    async for event in run.events():
        events.append(event)
        if isinstance(event, RunAsk):
            await run.answer(event.ask_id, allow, "" if allow else "no")
    return events


Agent = tuple[GrpcSandboxAgent, asyncio.Event, Path]


async def test_calls_share_one_stream(agent: Agent) -> None:
    client, _, _ = agent
    first = await client.run_builtin(bash("echo first"))  # no Health needed first
    assert isinstance((await collect(first))[-1], RunResult)
    runs = [await client.run_builtin(bash(f"echo {i}; sleep 0.0{i}; echo done{i}", f"c{i}")) for i in range(8)]
    assert all(isinstance(run, StreamedBuiltinRun) for run in runs)
    assert len({id(run._stream) for run in [first, *runs] if isinstance(run, StreamedBuiltinRun)}) == 1
    results = await asyncio.gather(*(collect(run) for run in runs))
    for i, events in enumerate(results):
        assert [type(e) for e in events[:1]] == [RunAsk]
        assert isinstance(events[-1], RunResult)
        assert events[-1].output == f"{i}\ndone{i}\n"
        assert all(isinstance(e, RunMetadata) for e in events[1:-1])


async def test_refusals_and_rule_allowed_asks_on_the_stream(agent: Agent) -> None:
    client, _, _ = agent
    refused = await collect(await client.run_builtin(bash("echo no")), allow=False)
    assert isinstance(refused[-1], RunFailed)
    assert refused[-1].message == "no"
    rules = _snapshot([Rule("*", "*", "allow"), Rule("bash", "rm *", "deny")], [], [])
    run = await client.run_builtin(replace(bash("echo yes"), rules=rules))
    events = await collect(run)
    assert not any(isinstance(e, RunAsk) for e in events)
    assert isinstance(events[-1], RunResult)
    assert events[-1].output == "yes\n"
    assert isinstance(run, StreamedBuiltinRun)
    assert [(a.permission, list(a.patterns), list(a.checks), a.opaque) for a in run.take_allowed()] == [
        ("bash", ["echo yes"], [], False)]
    assert run.take_allowed() == []
    denied = await collect(await client.run_builtin(replace(bash("rm -f nothing"), rules=rules)), allow=False)
    assert isinstance(denied[0], RunAsk)
    assert denied[0].patterns == ["rm -f nothing"]


async def test_cancelling_one_call_stops_it_and_spares_the_others(agent: Agent) -> None:
    client, _, workspace = agent
    marker = workspace / "slept"
    doomed = await client.run_builtin(bash(f"echo started; sleep 30; touch {marker}"))
    kept = await client.run_builtin(bash("sleep 0.3; echo kept", "k"))
    seen = doomed.events()
    assert isinstance(seen, AsyncGenerator)
    async for event in seen:
        if isinstance(event, RunAsk):
            await doomed.answer(event.ask_id, True)
        elif isinstance(event, RunMetadata) and event.metadata and "started" in str(event.metadata.get("output")):
            break
    doomed.cancel()
    await seen.aclose()
    kept_events = await collect(kept)
    assert isinstance(kept_events[-1], RunResult)
    assert kept_events[-1].output == "kept\n"
    for _ in range(200):
        if not _sleeping("sleep 30"):
            break
        await asyncio.sleep(0.02)
    assert not _sleeping("sleep 30")
    assert not marker.exists()
    after = await collect(await client.run_builtin(bash("echo after")))  # the stream still serves new calls
    assert isinstance(after[-1], RunResult)
    assert after[-1].output == "after\n"


async def test_a_consumer_that_stops_at_the_result_cancels_nothing(agent: Agent,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor returns at the result and leaves the generator to be closed later: that close must not send
    the agent a cancel for a call that is over (one wasted message each way per call)."""
    client, _, _ = agent
    cancels: list[bool] = []
    forget = SharedStream.forget

    def spy(self: SharedStream, number: int, *, cancel: bool) -> None:
        cancels.append(cancel)
        forget(self, number, cancel=cancel)

    monkeypatch.setattr(SharedStream, "forget", spy)
    for command in ("echo one", "exit 3"):
        run = await client.run_builtin(bash(command))
        seen = run.events()
        assert isinstance(seen, AsyncGenerator)
        async for event in seen:
            if isinstance(event, RunAsk):
                await run.answer(event.ask_id, True)
            elif isinstance(event, RunResult | RunFailed):
                break
        await seen.aclose()
    assert cancels == [False, False]
    unfinished = await client.run_builtin(bash("sleep 30"))
    seen = unfinished.events()
    assert isinstance(seen, AsyncGenerator)
    assert isinstance(await anext(seen), RunAsk)
    await seen.aclose()  # a consumer that leaves before the end does cancel
    assert cancels == [False, False, True]


async def test_a_lost_agent_fails_every_call_on_the_stream(agent: Agent) -> None:
    client, stop, _ = agent
    runs = [await client.run_builtin(bash("sleep 5", f"c{i}")) for i in range(3)]
    streams = [run.events() for run in runs]
    for run, events in zip(runs, streams, strict=True):
        first = await anext(events)
        assert isinstance(first, RunAsk)
        await run.answer(first.ask_id, True)
    stop.set()  # the agent shuts down: its server goes away under the calls
    for events in streams:
        with pytest.raises(SandboxLostError):
            async for _ in events:
                pass


def _sleeping(args: str) -> bool:
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == args.encode():
                    return True
        except OSError:
            continue
    return False
