"""The `task` tool over real gRPC: the test plays the client's subagent loop in the child session.

Sandboxes are in-process agents (the local provider); tests/docker/test_task_sandbox.py shows the
shared workspace and the abort cascade in a real container.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient, Subtask, ToolOutcome, allow_once
from controlplane.config import load_settings
from controlplane.v1 import event_pb2, session_pb2, tool_pb2
from tests.planes import Plane, new_instance, remove_data_dir, served_plane, short_tmp

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]
ABORTED = "Tool execution aborted"


plane = served_plane("local", tenants=TENANTS)


def task_args(description: str = "Find the answer", subagent: str = "general", **more: str) -> dict[str, str]:
    return {"description": description, "prompt": "Look around and report.", "subagent_type": subagent, **more}


def expected_output(child: str, text: str) -> str:
    return f"task_id: {child} (for resuming to continue this task if needed)\n\n<task_result>\n{text}\n</task_result>"


def answering(text: str, seen: list[Subtask]) -> Callable[[Subtask], Awaitable[str]]:
    async def run(subtask: Subtask) -> str:
        seen.append(subtask)
        return text

    return run


async def tool_ids(plane: Plane, session_id: str, **kwargs: str) -> list[str]:
    return [t.id for t in (await plane.client.list_tools(session_id, **kwargs)).tools]


async def until(predicate: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(500):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_round_trip_child_session_tools_and_exact_output(plane: Plane) -> None:
    parent = await plane.client.create_session()
    assert "task" in await tool_ids(plane, parent.id)
    loop_saw: dict[str, Any] = {}

    async def subagent_loop(subtask: Subtask) -> str:
        child = subtask.session_id
        loop_saw["subtask"] = subtask
        loop_saw["tools"] = await tool_ids(plane, child, agent=subtask.agent)
        loop_saw["session"] = await plane.client.get_session(child)
        wrote = await plane.client.execute_tool(
            child, "write", {"filePath": "from-child.txt", "content": "child was here\n"}, agent=subtask.agent,
        )
        assert wrote.error is None, wrote.error
        read = await plane.client.execute_tool(child, "read", {"filePath": "from-child.txt"}, agent=subtask.agent)
        loop_saw["read"] = read.output
        return "The answer is 42."

    out = await plane.client.execute_tool(parent.id, "task", task_args(), on_subtask=subagent_loop)
    subtask: Subtask = loop_saw["subtask"]
    child_id = subtask.session_id
    assert out.error is None, out.error
    assert out.output == expected_output(child_id, "The answer is 42.")
    assert out.result is not None
    assert out.result.title == "Find the answer"
    assert out.metadata == {"sessionId": child_id, "model": None, "truncated": False}
    assert (subtask.parent_session_id, subtask.agent, subtask.prompt, subtask.description, subtask.resumed) == (
        parent.id, "general", "Look around and report.", "Find the answer", False
    )
    assert subtask.model_json == ""
    [meta] = [e.metadata for e in out.events if e.WhichOneof("event") == "metadata"]
    assert meta.title == "Find the answer"
    assert json.loads(meta.metadata_json) == {"sessionId": child_id, "model": None}
    kinds = [e.WhichOneof("event") for e in out.events]
    assert kinds.index("metadata") < kinds.index("subtask") < kinds.index("result")

    # The child: a general subagent without the todo tools or task, on the parent's sandbox.
    tools = loop_saw["tools"]
    assert "task" not in tools
    assert "todowrite" not in tools
    assert "todoread" not in tools
    assert {"bash", "read", "write", "edit", "glob", "grep"} <= set(tools)
    child: session_pb2.Session = loop_saw["session"]
    assert (child.parent_id, child.title, child.agent) == (parent.id, "Find the answer (@general subagent)", "general")
    assert child.sandbox_id == parent.sandbox_id
    assert child.state == session_pb2.Session.READY
    assert loop_saw["read"].startswith("<path>")
    assert "1: child was here" in loop_saw["read"]
    # What the child wrote is in the parent's workspace.
    seen = await plane.client.execute_tool(parent.id, "read", {"filePath": "from-child.txt"})
    assert "1: child was here" in seen.output
    listed = {s.id: s for s in await plane.client.list_sessions()}
    assert listed[child_id].parent_id == parent.id
    assert listed[parent.id].parent_id == ""
    assert listed[parent.id].title == ""


async def test_resume_with_task_id_and_what_cannot_be_resumed(plane: Plane) -> None:
    parent = await plane.client.create_session()
    other = await plane.client.create_session()
    seen: list[Subtask] = []
    first = await plane.client.execute_tool(parent.id, "task", task_args(), on_subtask=answering("one", seen))
    child = seen[0].session_id
    again = await plane.client.execute_tool(
        parent.id, "task", task_args("Keep going", task_id=child), on_subtask=answering("two", seen)
    )
    assert first.output == expected_output(child, "one")
    assert again.output == expected_output(child, "two")
    assert (seen[1].session_id, seen[1].resumed, seen[1].description) == (child, True, "Keep going")
    assert (await plane.client.get_session(child)).title == "Find the answer (@general subagent)"  # kept

    # Another parent's child, an unknown id and a deleted child each start a fresh child.
    elsewhere = await plane.client.execute_tool(
        other.id, "task", task_args(task_id=child), on_subtask=answering("x", seen)
    )
    assert seen[2].session_id not in (child, "")
    assert not seen[2].resumed
    assert elsewhere.output == expected_output(seen[2].session_id, "x")
    await plane.client.execute_tool(parent.id, "task", task_args(task_id="ses_nope"), on_subtask=answering("y", seen))
    assert seen[3].session_id not in (child, seen[2].session_id)
    assert not seen[3].resumed
    await plane.client.delete_session(child)
    await plane.client.execute_tool(parent.id, "task", task_args(task_id=child), on_subtask=answering("z", seen))
    assert seen[4].session_id != child
    assert not seen[4].resumed


async def test_unknown_agent_after_the_permission_ask(plane: Plane) -> None:
    session = await plane.client.create_session()
    out = await plane.client.execute_tool(session.id, "task", task_args(subagent="nope"))
    assert out.error == "Unknown agent type: nope is not a valid agent type"
    assert out.permission_requests == []  # build allows task by default

    asking = await plane.client.create_session(config_json=json.dumps({"permission": {"task": "ask"}}))
    out = await plane.client.execute_tool(asking.id, "task", task_args("Do a thing", subagent="nope"),
                                          on_permission=allow_once)
    assert out.error == "Unknown agent type: nope is not a valid agent type"
    [asked] = out.permission_requests
    assert (asked.permission, list(asked.patterns), list(asked.always)) == ("task", ["nope"], ["*"])
    assert json.loads(asked.metadata_json) == {"description": "Do a thing", "subagent_type": "nope"}


async def test_permission_ask_and_the_answer_from_a_second_connection(plane: Plane) -> None:
    config = {"permission": {"task": {"*": "ask", "explore": "deny"}}}
    session = await plane.client.create_session(config_json=json.dumps(config))
    call, outbox = plane.client.tool_call(session.id, "task", task_args())
    events: list[tool_pb2.ToolEvent] = []
    async with AsyncClient(plane.plane.address, "token-alpha") as second:
        async for event in call:
            events.append(event)
            kind = event.WhichOneof("event")
            if kind == "permission_request":
                pending = [p.request.id for p in await second.pending_permissions(session.id)]
                assert pending == [event.permission_request.id]
                await second.reply_permission(event.permission_request.id, "once")
            elif kind == "subtask":
                with pytest.raises(grpc.aio.AioRpcError) as err:  # the wrong tenant cannot answer
                    async with AsyncClient(plane.plane.address, "token-beta") as beta:
                        await beta.complete_subtask(event.subtask.session_id, "stolen")
                assert err.value.code() == grpc.StatusCode.NOT_FOUND
                await second.complete_subtask(event.subtask.session_id, "from elsewhere")
            elif kind in ("result", "error"):
                break
    outbox.put_nowait(None)
    child = next(e.subtask.session_id for e in events if e.WhichOneof("event") == "subtask")
    assert events[-1].result.output == expected_output(child, "from elsewhere")
    assert [e.permission_request.patterns[0] for e in events if e.WhichOneof("event") == "permission_request"] == [
        "general"
    ]
    # A denied subagent fails with the rules and is not offered in the description.
    denied = await plane.client.execute_tool(session.id, "task", task_args(subagent="explore"))
    assert denied.error is not None
    assert '{"permission":"task","pattern":"explore","action":"deny"}' in denied.error
    [task] = [t for t in (await plane.client.list_tools(session.id)).tools if t.id == "task"]
    assert "\n- general: General-purpose agent" in task.description
    assert "- explore:" not in task.description
    with pytest.raises(grpc.aio.AioRpcError) as err:  # nothing waits any more
        await plane.client.complete_subtask(child, "late")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_description_lists_custom_subagents_and_child_rules_follow_the_subagent(plane: Plane) -> None:
    config = {
        "experimental": {"primary_tools": ["glob"]},
        "agent": {
            "reviewer": {"mode": "subagent", "permission": {"task": {"explore": "allow"}}},
            "helper": {"mode": "all", "description": "Helps.", "model": "acme/model-7"},
            "lead": {"mode": "primary", "description": "Not listed."},
        },
    }
    parent = await plane.client.create_session(config_json=json.dumps(config))
    [task] = [t for t in (await plane.client.list_tools(parent.id)).tools if t.id == "task"]
    assert "- reviewer: This subagent should only be called manually by the user.\n- helper: Helps.\n" in (
        task.description
    )
    assert "lead" not in task.description
    seen: dict[str, list[str]] = {}

    async def loop(subtask: Subtask) -> str:
        seen[subtask.agent] = await tool_ids(plane, subtask.session_id, agent=subtask.agent)
        seen[subtask.agent + ".model"] = [subtask.model_json]
        # A primary tool is hidden from the subagent, yet allowed if called.
        globbed = await plane.client.execute_tool(subtask.session_id, "glob", {"pattern": "*.none"})
        assert globbed.output == "No files found"
        nested = await plane.client.execute_tool(
            subtask.session_id, "task", task_args(subagent="explore"), agent=subtask.agent,
            on_subtask=answering("nested", []),
        )
        seen[subtask.agent + ".nested"] = [nested.error or nested.output]
        return "ok"

    for agent in ("reviewer", "helper", "explore"):
        out = await plane.client.execute_tool(parent.id, "task", task_args(subagent=agent), on_subtask=loop)
        assert out.error is None, out.error
    assert "task" in seen["reviewer"]
    assert "glob" not in seen["reviewer"]
    assert seen["reviewer.nested"][0].startswith("task_id: ses_")  # a grandchild session answered
    # Denied by the child session's rules, which the message lists with the agent's (the whole ruleset, as upstream).
    assert seen["helper.nested"][0].startswith("The user has specified a rule which prevents you from using")
    assert '{"permission":"task","pattern":"*","action":"deny"}' in seen["helper.nested"][0]
    assert "task" not in seen["helper"]
    assert "todowrite" not in seen["helper"]
    assert json.loads(seen["helper.model"][0]) == {"modelID": "model-7", "providerID": "acme"}
    assert seen["explore"] == ["bash", "read", "grep", "webfetch"]
    assert "glob" in await tool_ids(plane, parent.id)  # the parent is primary


async def test_subagent_failure_and_a_child_ending_fail_the_task(plane: Plane) -> None:
    parent = await plane.client.create_session()

    async def broken(_: Subtask) -> str:
        raise RuntimeError("the model is overloaded")

    out = await plane.client.execute_tool(parent.id, "task", task_args(), on_subtask=broken)
    assert out.error == "the model is overloaded"

    async def delete_child(subtask: Subtask) -> str:
        await plane.client.delete_session(subtask.session_id)
        await asyncio.sleep(5)
        return "never seen"

    out = await plane.client.execute_tool(parent.id, "task", task_args(), on_subtask=delete_child)
    assert out.error is not None
    assert out.error.startswith("The subagent's session ses_")
    assert out.error.endswith(" ended before it answered.")
    assert (await plane.client.execute_tool(parent.id, "bash", {"command": "echo alive", "description": "d"})).output \
        == "alive\n"  # deleting a child leaves the shared sandbox alone


async def test_deleting_the_parent_ends_its_children(plane: Plane) -> None:
    parent = await plane.client.create_session()
    seen: list[Subtask] = []
    await plane.client.execute_tool(parent.id, "task", task_args(), on_subtask=answering("done", seen))
    await plane.client.delete_session(parent.id)
    child = await plane.client.get_session(seen[0].session_id)
    assert child.state == session_pb2.Session.DELETED
    assert child.status_message == f"its parent session {parent.id} ended (deleted)"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plane.client.list_tools(child.id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    again = await plane.client.delete_session(child.id)  # idempotent
    assert again.state == session_pb2.Session.DELETED


async def test_abort_of_the_parent_cancels_the_child(plane: Plane, tmp_path: Any) -> None:
    parent = await plane.client.create_session()
    events = plane.client.subscribe_events()
    await events.initial_metadata()
    pid_file = tmp_path / "sleeper.pid"
    child_calls: list[asyncio.Future[ToolOutcome]] = []

    async def subagent_loop(subtask: Subtask) -> str:
        # The child's call runs on its own task: the client drops this loop when the task call ends.
        command = f"echo $$ > {pid_file}; exec sleep 30"
        child_calls.append(asyncio.ensure_future(plane.client.execute_tool(
            subtask.session_id, "bash", {"command": command, "description": "Sleeps"}, call_id="call_sleep",
        )))
        await asyncio.sleep(30)
        return "never"

    call_id = "call_parent_task"
    running = asyncio.ensure_future(plane.client.execute_tool(
        parent.id, "task", task_args(), call_id=call_id, on_subtask=subagent_loop,
    ))
    await until(lambda: _exists(pid_file), "the child's sleep to start")
    pid = int(pid_file.read_text())
    assert _alive(pid)
    assert await plane.client.cancel_tool_call(parent.id, call_id)
    out = await asyncio.wait_for(running, 10)
    assert out.error == ABORTED
    assert not _alive(pid)  # gone before the parent's error arrived
    child_call = await asyncio.wait_for(child_calls[0], 5)
    assert child_call.output.endswith("User aborted the command\n</bash_metadata>")
    child_id = json.loads(next(e.metadata.metadata_json for e in out.events if e.WhichOneof("event") == "metadata"))[
        "sessionId"
    ]
    seen: list[event_pb2.Event] = []
    async for event in events:
        seen.append(event)
        if event.type == "session.cancelled":
            break
    events.cancel()
    cancelled = json.loads(seen[-1].properties_json)
    assert (seen[-1].session_id, cancelled["sessionID"], cancelled["calls"]) == (child_id, child_id, 1)
    assert "subtask.started" in [e.type for e in seen]
    # The child is still usable afterwards (a later task may resume it).
    assert (await plane.client.execute_tool(child_id, "bash", {"command": "echo ok", "description": "d"})).output \
        == "ok\n"


async def _exists(path: Any) -> bool:
    return bool(path.exists() and path.read_text().strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    return False


async def test_children_follow_their_parent_across_a_restart() -> None:
    data_dir = short_tmp()
    settings = load_settings(None, data_dir=data_dir, instance=new_instance(), provider={"type": "local"},
                             server={"listen": "127.0.0.1:0"})
    token = ""
    seen: list[Subtask] = []
    try:
        first = await app.start(settings)
        token = (data_dir / "default.token").read_text().strip()
        try:
            async with AsyncClient(first.address, token) as client:
                parent = await client.create_session()
                await client.execute_tool(parent.id, "task", task_args(), on_subtask=answering("ok", seen))
        finally:
            await app.stop(first)
        second = await app.start(settings)  # adopts the parent's sandbox record, and the child with it
        try:
            async with AsyncClient(second.address, token) as client:
                # An in-process sandbox dies with its control plane: the restart finds it lost, which
                # ends the sandbox's owner (the parent) and, with it, the child.
                assert (await client.get_session(parent.id)).state == session_pb2.Session.FAILED
                child = await client.get_session(seen[0].session_id)
                assert (child.state, child.parent_id, child.title) == (
                    session_pb2.Session.FAILED, parent.id, "Find the answer (@general subagent)"
                )
                assert child.status_message == f"its parent session {parent.id} ended"
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await client.list_tools(child.id)
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await app.stop(second)
    finally:
        remove_data_dir(data_dir)


async def test_a_task_inside_a_batch_reaches_the_client_and_the_batch_completes(plane: Plane) -> None:
    config = json.dumps({"experimental": {"batch_tool": True}, "permission": {"task": "allow"}})
    parent = await plane.client.create_session(config_json=config)
    seen: list[Subtask] = []
    calls = [
        {"tool": "task", "parameters": task_args("Batched subtask")},
        {"tool": "glob", "parameters": {"pattern": "*.nothing"}},
    ]
    out = await asyncio.wait_for(plane.client.execute_tool(
        parent.id, "batch", {"tool_calls": calls}, on_subtask=answering("from the batch", seen),
    ), 20)
    assert out.error is None, out.error
    assert out.output == ("All 2 tools executed successfully.\n\n"
                          "Keep using the batch tool for optimal performance in your next response!")
    assert [s.description for s in seen] == ["Batched subtask"]
    results = [e.result.output for e in out.events if e.call_id != out.call_id and e.WhichOneof("event") == "result"]
    assert expected_output(seen[0].session_id, "from the batch") in results
