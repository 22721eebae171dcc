"""The plan agent's plan-file rule is relative to the session's worktree, as upstream writes it: in a git
workspace the plan agent may still write its plans (in its data dir), and a denied call shows the rule as
upstream does."""

from __future__ import annotations

import json

import pytest

from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

PLAN = "/tmp/home/.local/share/opencode/plans/plan.md"

session_id = workspace_session({"a.txt": "a\n"})


async def test_the_plan_agent_writes_its_plan_in_a_git_workspace(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    # A call before the workspace is a git repository: the sandbox's worktree was "/" then.
    assert (await client.execute_tool(session_id, "read", {"filePath": "a.txt"})).error is None
    assert (await client.run(session_id, ["git", "init", "-q", "/workspace"])).exit_code == 0
    await client.reload_tools(session_id)  # the worktree is taken again with the session's code
    wrote = await client.execute_tool(session_id, "write", {"filePath": PLAN, "content": "# plan\n"}, agent="plan")
    assert wrote.error is None
    denied = await client.execute_tool(session_id, "write", {"filePath": "/workspace/b.txt", "content": "b"},
                                       agent="plan")
    assert denied.error is not None
    rules = json.loads(denied.error.split("relevant rules ", 1)[1])
    assert rules == [
        {"permission": "*", "pattern": "*", "action": "allow"},
        {"permission": "edit", "pattern": "*", "action": "deny"},
        {"permission": "edit", "pattern": ".opencode/plans/*.md", "action": "allow"},
        {"permission": "edit", "pattern": "../tmp/home/.local/share/opencode/plans/*.md", "action": "allow"},
    ]
