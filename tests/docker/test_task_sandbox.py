"""The `task` tool against a real sandbox: the child session works in the parent's container and
workspace, and aborting the parent's task call kills what the child was running."""

from __future__ import annotations

import asyncio
import json

import pytest

from controlplane.client import Subtask, ToolOutcome
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import Plane

pytestmark = pytest.mark.docker

WS = "/workspace"
TASK = {"description": "Write a note", "prompt": "Leave a note in the workspace.", "subagent_type": "general"}


def expected_output(child: str, text: str) -> str:
    return f"task_id: {child} (for resuming to continue this task if needed)\n\n<task_result>\n{text}\n</task_result>"


async def test_child_shares_the_sandbox_and_workspace(docker_plane: Plane) -> None:
    client = docker_plane.client
    parent = await client.create_session(workspace_archive=tar_of({"seed.txt": "from the parent\n"}))
    seen: dict[str, str] = {}

    async def subagent_loop(subtask: Subtask) -> str:
        child = subtask.session_id
        seen["tools"] = " ".join(t.id for t in (await client.list_tools(child, agent=subtask.agent)).tools)
        seen["seed"] = (await client.execute_tool(child, "read", {"filePath": f"{WS}/seed.txt"})).output
        wrote = await client.execute_tool(child, "write", {"filePath": f"{WS}/note.txt", "content": "child note\n"})
        assert wrote.error is None, wrote.error
        seen["read"] = (await client.execute_tool(child, "read", {"filePath": f"{WS}/note.txt"})).output
        seen["host"] = (await client.run(child, ["cat", "/etc/hostname"])).stdout.decode()
        return "Left a note."

    out = await client.execute_tool(parent.id, "task", TASK, on_subtask=subagent_loop)
    child = json.loads(out.result.metadata_json)["sessionId"] if out.result else ""
    assert out.output == expected_output(child, "Left a note.")
    assert seen["read"] == (
        f"<path>{WS}/note.txt</path>\n<type>file</type>\n<content>1: child note\n\n"
        "(End of file - total 1 lines)\n</content>"
    )
    assert "1: from the parent" in seen["seed"]
    assert "task" not in seen["tools"].split()
    assert "bash" in seen["tools"].split()
    # Same container, same workspace: no sandbox was made for the child.
    assert seen["host"] == (await client.run(parent.id, ["cat", "/etc/hostname"])).stdout.decode()
    assert (await client.get_session(child)).sandbox_id == parent.sandbox_id
    assert (await client.run(parent.id, ["cat", f"{WS}/note.txt"])).stdout == b"child note\n"

    # Deleting the child leaves the shared sandbox running; deleting the parent ends both.
    await client.delete_session(child)
    assert (await client.run(parent.id, ["true"])).exit_code == 0
    await client.delete_session(parent.id)
    assert (await client.get_session(child)).state == session_pb2.Session.DELETED


async def test_abort_cascade_kills_the_childs_process(docker_plane: Plane) -> None:
    client = docker_plane.client
    parent = await client.create_session()
    child_calls: list[asyncio.Future[ToolOutcome]] = []

    async def subagent_loop(subtask: Subtask) -> str:
        child_calls.append(asyncio.ensure_future(client.execute_tool(
            subtask.session_id, "bash", {"command": "sleep 317", "description": "Sleeps a while"},
        )))
        await asyncio.sleep(60)
        return "never"

    running = asyncio.ensure_future(client.execute_tool(
        parent.id, "task", TASK, call_id="call_task_abort", on_subtask=subagent_loop,
    ))
    for _ in range(200):
        if b"sleep 317" in (await client.run(parent.id, ["ps", "-eo", "args="])).stdout:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the child's command never started")
    assert await client.cancel_tool_call(parent.id, "call_task_abort")
    out = await asyncio.wait_for(running, 15)
    assert out.error == "Tool execution aborted"
    assert b"sleep 317" not in (await client.run(parent.id, ["ps", "-eo", "args="])).stdout
    child_call = await asyncio.wait_for(child_calls[0], 10)
    assert child_call.output.endswith("User aborted the command\n</bash_metadata>")
    await client.delete_session(parent.id)
