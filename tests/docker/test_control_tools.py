"""Control-plane tools against real sandboxes: a question answered from a second connection, a batch
mixing successes and failures in the workspace, and todos surviving a SIGKILL of the control plane."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.planes import (
    Plane,
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    short_tmp,
    workspace_session,
)

pytestmark = pytest.mark.docker

FILES = {
    "src/main.py": "print('hi')\n", "notes.txt": "alpha\nbeta\n",
    ".opencode/tool/triple.ts": 'import { tool } from "@opencode-ai/plugin"\n'
                                'export default tool({ description: "triples", args: { n: tool.schema.number() },\n'
                                '  async execute(args) { return `n=${args.n * 3}` } })\n',
}
CONFIG = json.dumps({"experimental": {"batch_tool": True}})
QUESTION = {"questions": [{"question": "Deploy now?", "header": "Deploy", "options": [
    {"label": "Yes", "description": "Ship it"}, {"label": "No", "description": "Wait"}]}]}


session_id = workspace_session(FILES, config_json=CONFIG)


async def test_question_answered_from_a_second_connection(docker_plane: Plane, session_id: str) -> None:
    run = asyncio.ensure_future(docker_plane.client.execute_tool(session_id, "question", QUESTION))
    async with AsyncClient(docker_plane.plane.address, docker_plane.token) as ui:
        for _ in range(500):
            pending = await ui.pending_questions(session_id)
            if pending:
                break
            await asyncio.sleep(0.01)
        [asked] = pending
        assert json.loads(asked.question.questions_json) == QUESTION["questions"]
        await ui.reply_question(asked.question.id, [["No"]])
    out = await asyncio.wait_for(run, 10)
    assert out.output == 'User has answered your questions: "Deploy now?"="No". You can now continue with the ' \
        "user's answers in mind."
    assert [q.id for q in out.questions] == [asked.question.id]


async def test_batch_mixing_successes_and_failures_in_the_workspace(docker_plane: Plane, session_id: str) -> None:
    calls = [
        {"tool": "bash", "parameters": {"command": "cat src/main.py", "description": "Shows the script"}},
        {"tool": "read", "parameters": {"filePath": "/workspace/notes.txt"}},
        {"tool": "grep", "parameters": {"pattern": "beta"}},
        {"tool": "read", "parameters": {"filePath": "/workspace/missing.txt"}},
        {"tool": "write", "parameters": {"filePath": "/workspace/out.txt", "content": "written\n"}},
        {"tool": "my_mcp_tool", "parameters": {}},
    ]
    out = await docker_plane.client.execute_tool(session_id, "batch", {"tool_calls": calls})
    assert out.output == "Executed 4/6 tools successfully. 2 failed."
    assert out.metadata["details"] == [
        {"tool": "bash", "success": True}, {"tool": "read", "success": True}, {"tool": "grep", "success": True},
        {"tool": "read", "success": False}, {"tool": "write", "success": True},
        {"tool": "my_mcp_tool", "success": False},
    ]
    ends: dict[str, str] = {}
    for event in out.events:
        kind = event.WhichOneof("event")
        if event.call_id != out.call_id and kind in ("result", "error"):
            assert event.call_id not in ends
            ends[event.call_id] = event.result.output if kind == "result" else event.error.message
    texts = sorted(ends.values())
    assert "print('hi')\n" in texts
    assert any("1: alpha\n2: beta" in t for t in texts)
    assert any(t.startswith("Found 1 matches") and "/workspace/notes.txt" in t for t in texts)
    assert any(t.startswith("File not found: /workspace/missing.txt") for t in texts)
    assert any(t.startswith("Tool 'my_mcp_tool' not in registry. External tools (MCP, environment) cannot be batched")
               for t in texts)
    shown = await docker_plane.client.run(session_id, ["cat", "out.txt"])
    assert shown.stdout == b"written\n"


async def test_batch_runs_the_projects_custom_tools_and_lists_them(docker_plane: Plane, session_id: str) -> None:
    calls = [{"tool": "triple", "parameters": {"n": 14}}, {"tool": "nope", "parameters": {}}]
    out = await docker_plane.client.execute_tool(session_id, "batch", {"tool_calls": calls})
    assert out.output == "Executed 1/2 tools successfully. 1 failed."
    texts = sorted(e.result.output if e.WhichOneof("event") == "result" else e.error.message
                   for e in out.events if e.call_id != out.call_id and e.WhichOneof("event") in ("result", "error"))
    assert "n=42" in texts
    [refusal] = [t for t in texts if t != "n=42"]
    assert refusal.startswith("Tool 'nope' not in registry. External tools (MCP, environment) cannot be batched")
    available = refusal.split("Available tools: ", 1)[1]
    assert "triple" in available.split(", ")
    assert "read" in available.split(", ")


async def test_todos_survive_a_sigkill_of_the_control_plane() -> None:
    data_dir, instance = short_tmp(), new_instance("td")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    todos = [{"content": "Survive ☂", "status": "in_progress", "priority": "high"}]
    expected = '[\n  {\n    "content": "Survive ☂",\n    "status": "in_progress",\n    "priority": "high"\n  }\n]'
    try:
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            session = await client.create_session()
            written = await client.execute_tool(session.id, "todowrite", {"todos": todos})
            assert written.output == expected
        process.kill()
        target = await process.start()
        async with AsyncClient(target, process.token()) as client:
            assert (await client.get_session(session.id)).state == session_pb2.Session.READY
            read = await client.execute_tool(session.id, "todoread", {})
            assert read.output == expected
            assert read.result is not None
            assert read.result.title == "1 todos"
            await client.delete_session(session.id)
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
