"""todowrite/todoread, batch and plan_exit over real gRPC (in-process agents): exact outputs, the
per-session and persisted todo list, batch entries as calls of their own, plan_exit's Yes/No."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from controlplane import app
from controlplane.client import AsyncClient, ToolOutcome, allow_once
from controlplane.config import load_settings
from controlplane.core.permissions.permission import REJECTED_MESSAGE
from controlplane.v1 import tool_pb2
from tests.planes import Plane, environment, remove_data_dir, served_plane, short_tmp

FLAGS = {"OPENCODE_EXPERIMENTAL_PLAN_MODE": "1"}
CLEARED = ("OPENCODE_CLIENT", "OPENCODE_EXPERIMENTAL", "OPENCODE_ENABLE_EXA", "OPENCODE_EXPERIMENTAL_EXA",
           "OPENCODE_EXPERIMENTAL_LSP_TOOL", "OPENCODE_ENABLE_QUESTION_TOOL")
BATCH = json.dumps({"experimental": {"batch_tool": True}, "permission": {"bash": {"*": "allow", "git *": "ask"}}})
TODOS = [
    {"status": "in_progress", "content": "Écrire les tests ✓", "priority": "high"},
    {"content": "Ship it", "status": "pending", "priority": "medium", "owner": "me", "7": 1.0},
    {"content": "Old work", "status": "completed", "priority": "low"},
    {"content": "Dropped", "status": "cancelled", "priority": "low"},
]
TODOS_OUTPUT = """[
  {
    "status": "in_progress",
    "content": "Écrire les tests ✓",
    "priority": "high"
  },
  {
    "7": 1,
    "content": "Ship it",
    "status": "pending",
    "priority": "medium",
    "owner": "me"
  },
  {
    "content": "Old work",
    "status": "completed",
    "priority": "low"
  },
  {
    "content": "Dropped",
    "status": "cancelled",
    "priority": "low"
  }
]"""
AVAILABLE = "question, bash, read, glob, grep, edit, write, task, webfetch, todowrite, skill, plan_exit"


# The registry reads the OPENCODE_* flags when the plane starts.
flags = environment("flags", FLAGS, cleared=CLEARED)


plane = served_plane("local", needs=("flags",))


def ids(listing: tool_pb2.ListToolsResponse) -> list[str]:
    return [t.id for t in listing.tools]


# -- todos ---------------------------------------------------------------------------------------


async def test_todo_round_trip_is_exact_and_per_session(plane: Plane) -> None:
    session = await plane.client.create_session()
    other = await plane.client.create_session()
    written = await plane.client.execute_tool(session.id, "todowrite", {"todos": TODOS})
    assert written.output == TODOS_OUTPUT
    assert written.result is not None
    assert written.result.title == "3 todos"
    assert written.metadata["todos"][1] == {"content": "Ship it", "status": "pending", "priority": "medium",
                                            "owner": "me", "7": 1}
    read = await plane.client.execute_tool(session.id, "todoread", {})
    assert (read.output, read.result and read.result.title) == (TODOS_OUTPUT, "3 todos")
    empty = await plane.client.execute_tool(other.id, "todoread", {})
    assert (empty.output, empty.result and empty.result.title) == ("[]", "0 todos")
    cleared = await plane.client.execute_tool(session.id, "todowrite", {"todos": []})
    assert (cleared.output, cleared.result and cleared.result.title) == ("[]", "0 todos")
    assert (await plane.client.execute_tool(session.id, "todoread", {})).output == "[]"
    listed = ids(await plane.client.list_tools(session.id))
    assert "todowrite" in listed
    assert "todoread" not in listed


async def test_todo_permission_and_validation(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=json.dumps({"permission": {"todoread": "ask"}}))
    asked: list[tool_pb2.PermissionRequest] = []

    async def reject(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    out = await plane.client.execute_tool(session.id, "todoread", {}, on_permission=reject)
    assert out.error == REJECTED_MESSAGE
    assert [(r.permission, list(r.patterns), list(r.always)) for r in asked] == [("todoread", ["*"], ["*"])]
    denied = await plane.client.execute_tool(session.id, "todowrite", {"todos": []}, agent="general")
    assert denied.error is not None
    assert denied.error.startswith("The user has specified a rule which prevents")
    assert "todowrite" not in ids(await plane.client.list_tools(session.id, agent="general"))
    bad = await plane.client.execute_tool(session.id, "todowrite", {"todos": [{"content": "x", "status": "pending"}]})
    assert bad.error is not None
    assert bad.error.startswith("The todowrite tool was called with invalid arguments: [\n")
    assert '"path": [\n      "todos",\n      0,\n      "priority"\n    ]' in bad.error


async def test_todos_survive_a_restart_of_the_plane(flags: None) -> None:
    data_dir = short_tmp()
    settings = load_settings(None, data_dir=data_dir, instance="todo-restart", provider={"type": "local"},
                             server={"listen": "127.0.0.1:0"})
    try:
        plane = await app.start(settings)
        async with AsyncClient(plane.address, (data_dir / "default.token").read_text().strip()) as client:
            session = await client.create_session()
            await client.execute_tool(session.id, "todowrite", {"todos": TODOS})
        await app.stop(plane)
        plane = await app.start(settings)
        stored = await plane.store.get_todos(session.id)
        await app.stop(plane)
    finally:
        remove_data_dir(data_dir)
    assert json.dumps(stored, ensure_ascii=False) == json.dumps(
        [TODOS[0], {"content": "Ship it", "status": "pending", "priority": "medium", "owner": "me", "7": 1.0},
         *TODOS[2:]], ensure_ascii=False,
    )


# -- batch ---------------------------------------------------------------------------------------


def entries_of(out: ToolOutcome) -> dict[str, list[tool_pb2.ToolEvent]]:
    """The batch's entries' events by call id, in the order their first event came."""
    entries: dict[str, list[tool_pb2.ToolEvent]] = {}
    for event in out.events:
        if event.call_id != out.call_id:
            entries.setdefault(event.call_id, []).append(event)
    return entries


def ending(events: list[tool_pb2.ToolEvent]) -> tuple[str, str]:
    ends = [e for e in events if e.WhichOneof("event") in ("result", "error")]
    assert len(ends) == 1, events
    end = ends[0]
    kind = str(end.WhichOneof("event"))
    return kind, end.result.output if kind == "result" else end.error.message


async def test_batch_is_listed_only_with_the_session_flag(plane: Plane) -> None:
    plain = await plane.client.create_session()
    flagged = await plane.client.create_session(config_json=BATCH)
    assert "batch" not in ids(await plane.client.list_tools(plain.id))
    listed = ids(await plane.client.list_tools(flagged.id))
    assert listed[listed.index("skill"):] == ["skill", "batch"]  # plan_exit is denied to build
    planning = ids(await plane.client.list_tools(flagged.id, agent="plan"))
    assert planning[planning.index("skill"):] == ["skill", "batch", "plan_exit"]
    out = await plane.client.execute_tool(plain.id, "batch", {"tool_calls": []})
    assert out.output.startswith("The arguments provided to the tool are invalid: Model tried to call unavailable tool")


async def test_batch_mixing_successes_and_failures(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=BATCH)
    calls = [
        {"tool": "bash", "parameters": {"command": "echo one", "description": "Prints one"}},
        {"tool": "todowrite", "parameters": {"todos": TODOS[:1]}},
        {"tool": "read", "parameters": {"limit": 3}},
        {"tool": "batch", "parameters": {"tool_calls": []}},
        {"tool": "nope", "parameters": {}},
        {"tool": "apply_patch", "parameters": {"patchText": "x"}},
        {"tool": "invalid", "parameters": {"tool": "t", "error": "e"}},
    ]
    out = await plane.client.execute_tool(session.id, "batch", {"tool_calls": calls})
    assert out.result is not None
    assert out.output == "Executed 3/7 tools successfully. 4 failed."
    assert out.result.title == "Batch execution (3/7 successful)"
    assert out.metadata == {
        "totalCalls": 7, "successful": 3, "failed": 4, "tools": [c["tool"] for c in calls],
        "details": [{"tool": c["tool"], "success": ok} for c, ok in zip(calls, [1, 1, 0, 0, 0, 0, 1], strict=True)],
        "truncated": False,
    }
    entries = entries_of(out)
    assert len(entries) == 7
    assert all(cid.startswith("call_") for cid in entries)
    endings = sorted(ending(events) for events in entries.values())
    assert endings == sorted([
        ("result", "one\n"),
        ("result", json.dumps(TODOS[:1], indent=2, ensure_ascii=False)),
        ("error", "The read tool was called with invalid arguments: [\n  {\n    \"expected\": \"string\",\n"
                  "    \"code\": \"invalid_type\",\n    \"path\": [\n      \"filePath\"\n    ],\n"
                  "    \"message\": \"Invalid input: expected string, received undefined\"\n  }\n].\n"
                  "Please rewrite the input so it satisfies the expected schema."),
        ("error", "Tool 'batch' is not allowed in batch. Disallowed tools: batch"),
        ("error", "Tool 'nope' not in registry. External tools (MCP, environment) cannot be batched - call them"
                  f" directly. Available tools: {AVAILABLE}"),
        ("error", "Tool 'apply_patch' not in registry. External tools (MCP, environment) cannot be batched - call"
                  f" them directly. Available tools: {AVAILABLE}"),
        ("result", "The arguments provided to the tool are invalid: e"),
    ])
    ran = [events for events in entries.values() if len(events) > 2]  # refused ones only end with an error
    assert len(ran) == 4
    for events in ran:
        states = [e.state.status for e in events if e.WhichOneof("event") == "state"]
        assert states[:2] == [tool_pb2.ToolState.PENDING, tool_pb2.ToolState.RUNNING]
        assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert out.events[-1].call_id == out.call_id  # the batch's own result comes last


async def test_batch_all_successful_and_more_than_25(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=BATCH)
    entry = {"tool": "invalid", "parameters": {"tool": "t", "error": "e"}}
    out = await plane.client.execute_tool(session.id, "batch", {"tool_calls": [entry, entry]})
    assert out.output == "All 2 tools executed successfully.\n\n" \
        "Keep using the batch tool for optimal performance in your next response!"
    assert out.result is not None
    assert out.result.title == "Batch execution (2/2 successful)"
    out = await plane.client.execute_tool(session.id, "batch", {"tool_calls": [entry] * 27})
    assert out.output == "Executed 25/27 tools successfully. 2 failed."
    endings = [ending(events) for events in entries_of(out).values()]
    assert endings.count(("error", "Maximum of 25 tools allowed in batch")) == 2
    assert [e for e in entries_of(out).values()][-1][-1].error.message == "Maximum of 25 tools allowed in batch"


@pytest.mark.parametrize(("args", "lines"), [
    ({"tool_calls": []}, ["  - tool_calls: Provide at least one tool call"]),
    ({}, ["  - tool_calls: Invalid input: expected array, received undefined"]),
    ({"tool_calls": [{"tool": 1}]}, [
        "  - tool_calls.0.tool: Invalid input: expected string, received number",
        "  - tool_calls.0.parameters: Invalid input: expected object, received undefined",
    ]),
    ({"tool_calls": [{"tool": "read", "parameters": []}]},
     ["  - tool_calls.0.parameters: Invalid input: expected object, received array"]),
])
async def test_batch_validation_message(plane: Plane, args: dict[str, Any], lines: list[str]) -> None:
    session = await plane.client.create_session(config_json=BATCH)
    out = await plane.client.execute_tool(session.id, "batch", args)
    assert out.error == "Invalid parameters for tool 'batch':\n" + "\n".join(lines) + \
        '\n\nExpected payload format:\n  [{"tool": "tool_name", "parameters": {...}}, {...}]'


async def test_batch_entries_ask_permission_and_publish_their_states(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=BATCH)
    subscription = plane.client.subscribe_events(session.id)
    states: list[dict[str, Any]] = []

    async def collect() -> None:
        async for event in subscription:
            if event.type == "tool.state":
                states.append(json.loads(event.properties_json))

    collector = asyncio.ensure_future(collect())
    await asyncio.sleep(0.05)
    asked: list[tool_pb2.PermissionRequest] = []

    async def reject(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    calls = [{"tool": "bash", "parameters": {"command": "git status", "description": "Shows status"}}]
    out = await plane.client.execute_tool(session.id, "batch", {"tool_calls": calls}, call_id="call_outer",
                                          on_permission=reject)
    assert out.output == "Executed 0/1 tools successfully. 1 failed."
    [(entry_id, events)] = entries_of(out).items()
    assert [list(r.patterns) for r in asked] == [["git status"]]
    assert [e.call_id for e in out.events if e.WhichOneof("event") == "permission_request"] == [entry_id]
    assert ending(events) == ("error", REJECTED_MESSAGE)
    for _ in range(200):
        if len(states) >= 6:
            break
        await asyncio.sleep(0.01)
    subscription.cancel()
    collector.cancel()
    assert [(s["callID"], s["status"], s.get("parentCallID")) for s in states] == [
        ("call_outer", "pending", None), ("call_outer", "running", None),
        (entry_id, "pending", "call_outer"), (entry_id, "running", "call_outer"), (entry_id, "error", "call_outer"),
        ("call_outer", "completed", None),
    ]


async def test_aborting_a_batch_aborts_its_entries(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=BATCH)
    question = {"questions": [{"question": "Go?", "header": "Go", "options": []}]}
    calls = [{"tool": "question", "parameters": question},
             {"tool": "bash", "parameters": {"command": "sleep 30", "description": "Waits"}}]
    run = asyncio.ensure_future(
        plane.client.execute_tool(session.id, "batch", {"tool_calls": calls}, call_id="call_batch_abort")
    )
    for _ in range(500):
        if await plane.client.pending_questions(session.id):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the bash entry is running too
    assert await plane.client.cancel_tool_call(session.id, "call_batch_abort")
    out = await asyncio.wait_for(run, 10)
    assert out.error == "Tool execution aborted"
    endings = {ending(events) for events in entries_of(out).values()}
    assert ("error", "Tool execution aborted") in endings  # the question
    [(kind, text)] = endings - {("error", "Tool execution aborted")}
    assert kind == "result"
    assert "User aborted the command" in text
    assert len({e.call_id for e in out.events}) == 3
    assert await plane.client.pending_questions(session.id) == []


# -- plan_exit -----------------------------------------------------------------------------------


async def test_plan_exit_yes_and_no(plane: Plane) -> None:
    session = await plane.client.create_session(agent="plan")
    assert "plan_exit" in ids(await plane.client.list_tools(session.id))
    assert "plan_exit" not in ids(await plane.client.list_tools(session.id, agent="build"))  # denied by default
    seen: list[dict[str, Any]] = []

    def answering(label: str) -> Any:
        async def answer(question: tool_pb2.Question) -> list[list[str]]:
            seen.extend(json.loads(question.questions_json))
            return [[label]]

        return answer

    out = await plane.client.execute_tool(session.id, "plan_exit", {}, on_question=answering("Yes"))
    plan = re.fullmatch(r"Plan at (.+) is complete\. Would you like to switch to the build agent and start "
                        r"implementing\?", seen[0]["question"])
    assert plan is not None
    rel = plan.group(1)
    assert re.fullmatch(rf"[^/].*/\.local/share/opencode/plans/\d+-{session.id}\.md", rel)
    assert seen[0] == {
        "question": seen[0]["question"], "header": "Build Agent", "custom": False, "options": [
            {"label": "Yes", "description": "Switch to build agent and start implementing the plan"},
            {"label": "No", "description": "Stay with plan agent to continue refining the plan"},
        ],
    }
    assert out.result is not None
    assert out.result.title == "Switching to build agent"
    assert out.output == "User approved switching to build agent. Wait for further instructions."
    assert out.metadata == {
        "switch_agent": "build", "truncated": False,
        "message": f"The plan at {rel} has been approved, you can now edit files. Execute the plan",
    }
    no = await plane.client.execute_tool(session.id, "plan_exit", {}, on_question=answering("No"))
    assert no.error == "The user dismissed this question"
    # A third identical call asks doom_loop: approved, as before the default became a rejection.
    other = await plane.client.execute_tool(session.id, "plan_exit", {}, on_question=answering("Maybe later"),
                                            on_permission=allow_once)
    assert other.output == "User approved switching to build agent. Wait for further instructions."
