"""What the tool runtime keeps per session (core/calls/runtime_sessions.py): made on first need, and nothing of it
left once the session has ended and its last call is over."""

from __future__ import annotations

import asyncio

from controlplane.core.calls.runtime_sessions import RunningCall, RuntimeSessions
from controlplane.core.calls.tool_runtime import ToolRuntime
from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane


def running(session_id: str, call_id: str) -> RunningCall:
    return RunningCall(session_id, call_id, asyncio.Queue(), asyncio.Event())


async def test_an_ended_session_without_calls_is_dropped_at_once() -> None:
    kept = RuntimeSessions()
    state = kept.of("ses_a")
    state.home = "/home/tool"
    assert kept.of("ses_a") is state
    kept.end("ses_a")
    assert "ses_a" not in kept
    assert len(kept) == 0


async def test_a_call_outliving_its_session_stays_reachable_until_it_ends() -> None:
    kept = RuntimeSessions()
    state = kept.of("ses_a")
    state.home = "/home/tool"
    first, second = running("ses_a", "c1"), running("ses_a", "c2")
    state.calls.update(c1=first, c2=second)
    kept.end("ses_a")
    assert state.home is None  # the cached parts go with the session
    assert kept.call("ses_a", "c1") is first  # the calls do not: they can still be aborted
    kept.call_ended(first)
    assert kept.call("ses_a", "c2") is second
    kept.call_ended(second)
    assert "ses_a" not in kept


async def test_a_call_made_ready_while_its_session_ended_is_held_until_it_ends() -> None:
    kept = RuntimeSessions()
    state = kept.of("ses_a")
    kept.end("ses_a")  # the session ended while a call was getting ready with `state`
    assert "ses_a" not in kept
    call = running("ses_a", "c1")
    kept.add_call(state, call)
    assert kept.call("ses_a", "c1") is call  # abortable like any other
    kept.call_ended(call)
    assert "ses_a" not in kept


async def test_a_call_ending_after_its_id_was_taken_again_leaves_the_new_one() -> None:
    kept = RuntimeSessions()
    old, new = running("ses_a", "c1"), running("ses_a", "c1")
    kept.of("ses_a").calls["c1"] = new
    kept.call_ended(old)
    assert kept.call("ses_a", "c1") is new


async def test_ending_a_session_the_runtime_never_saw_keeps_nothing() -> None:
    kept = RuntimeSessions()
    kept.end("ses_unknown")
    assert len(kept) == 0


plane = served_plane("local", scope="function")


def runtime_of(plane: Plane) -> RuntimeSessions:
    tools: ToolRuntime = plane.plane.tools
    return tools._sessions_kept


async def test_a_deleted_session_leaves_no_state_in_the_runtime(plane: Plane) -> None:
    kept = runtime_of(plane)
    session = await plane.client.create_session()
    other = await plane.client.create_session()
    await plane.client.list_tools(session.id)
    out = await plane.client.execute_tool(session.id, "bash", {"command": "echo hi", "description": "Greets"})
    assert out.output == "hi\n"
    await plane.client.list_tools(other.id)
    state = kept.get(session.id)
    assert state is not None
    assert state.home
    assert state.custom is not None
    assert state.agents is not None
    assert state.calls == {}  # a finished call is gone at once
    await plane.client.delete_session(session.id)
    assert session.id not in kept
    assert other.id in kept  # the other session's share stays


async def test_a_call_running_when_its_session_ends_leaves_no_state_when_it_is_over(plane: Plane) -> None:
    kept = runtime_of(plane)
    session = await plane.client.create_session()
    call, outbox = plane.client.tool_call(
        session.id, "bash", {"command": "sleep 60", "description": "Waits"}, call_id="c-long",
    )
    try:
        events = aiter(call)
        async with asyncio.timeout(30):
            while (await anext(events)).state.status != tool_pb2.ToolState.RUNNING:
                pass
        assert kept.call(session.id, "c-long") is not None
        await plane.client.delete_session(session.id)
        async with asyncio.timeout(30):
            rest = [event async for event in events]
    finally:
        outbox.put_nowait(None)
        call.cancel()
    assert rest[-1].WhichOneof("event") == "error"  # the sandbox went away under it
    assert session.id not in kept
