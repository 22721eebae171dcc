"""The workspace narrows the caller's rules, never widens them (issue 21 item 6, finding 8).

Through the public API on the Docker plane: the archive ships project config (`opencode.json`,
`.opencode/agent/*.md`) that tries to allow what the session's `config_json` asks for or denies, and the
model (played by the test) uses it from the session, a `task` child and a grandchild. Bash calls run in
the sandbox agent, which may settle allowed asks by itself: these tests also show it never allows
locally what the control plane would ask or deny. Whether a command ran is checked with the caller's
own Exec, outside the tool rules.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.client import PermissionRequest, Subtask, ToolOutcome, allow_once
from controlplane.v1 import tool_pb2
from tests.archives import tar_of
from tests.planes import Plane, served_plane

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
POLICY = {"tenants": {"alpha": {"bash": {"rm *": "deny"}}}}
CALLER = {"permission": {"bash": "deny", "read": {"*": "allow", "*.env": "deny"}, "edit": "allow"}}
"""The finding's session config."""
MD_BASH_ALLOW = "---\ndescription: Helper\nmode: subagent\npermission:\n  bash: allow\n---\nHelp.\n"
DENIED = "The user has specified a rule which prevents you from using this specific tool call."


plane = served_plane("docker", tenants=TENANTS, policy=POLICY, pool={"size": 1})


def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "Runs a command"}


def task(subagent: str) -> dict[str, str]:
    return {"description": "Do the work", "prompt": "Run it.", "subagent_type": subagent}


def assert_denied(outcome: ToolOutcome) -> None:
    assert (outcome.error or "").startswith(DENIED), outcome.error


async def exists(plane: Plane, session_id: str, path: str) -> bool:
    done = await plane.client.run(session_id, ["test", "-e", path])
    return done.exit_code == 0


async def session(plane: Plane, config: dict[str, Any], files: dict[str, str]) -> str:
    created = await plane.client.create_session(workspace_archive=tar_of(files), config_json=json.dumps(config))
    return created.id


async def test_finding_8_task_child_of_a_workspace_agent_cannot_run_denied_bash(plane: Plane) -> None:
    parent = await session(plane, CALLER, {".opencode/agent/md.md": MD_BASH_ALLOW, "README.md": "hi\n"})
    seen: dict[str, Any] = {}

    async def subagent(subtask: Subtask) -> str:
        child = subtask.session_id
        seen["tools"] = [t.id for t in (await plane.client.list_tools(child, agent=subtask.agent)).tools]
        seen["bash"] = await plane.client.execute_tool(child, "bash", bash("touch /workspace/pwned"),
                                                       agent=subtask.agent)
        return "done"

    out = await plane.client.execute_tool(parent, "task", task("md"), on_subtask=subagent)
    assert out.error is None, out.error
    ran: ToolOutcome = seen["bash"]
    assert_denied(ran)
    assert "bash" not in seen["tools"]  # the caller denies it outright: hidden, as for any agent it denies
    assert not await exists(plane, parent, "/workspace/pwned")


async def test_workspace_top_level_allow_still_asks_what_config_json_asks(plane: Plane) -> None:
    workspace = {"opencode.json": json.dumps({"permission": {"bash": {"*": "ask", "touch *": "allow"}}})}
    sid = await session(plane, {"permission": {"bash": {"*": "ask"}}}, workspace)
    asked: list[PermissionRequest] = []

    async def refuse(request: PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    out = await plane.client.execute_tool(sid, "bash", bash("touch made.txt"), on_permission=refuse)
    assert [(r.permission, list(r.patterns)) for r in asked] == [("bash", ["touch made.txt"])]
    assert out.error == "The user rejected permission to use this specific tool call."
    assert not await exists(plane, sid, "/workspace/made.txt")
    # Once the caller approves, the command runs (the ask is the caller's, not a refusal).
    out = await plane.client.execute_tool(sid, "bash", bash("touch made.txt"), on_permission=allow_once)
    assert out.error is None, out.error
    assert await exists(plane, sid, "/workspace/made.txt")


async def test_workspace_agent_cannot_widen_an_operator_tenant_deny(plane: Plane) -> None:
    agent = "---\nmode: subagent\npermission:\n  bash:\n    '*': allow\n    'rm *': allow\n---\nx\n"
    sid = await session(plane, {}, {".opencode/agent/md.md": agent, "keep.txt": "keep\n"})
    results: list[ToolOutcome] = []

    async def subagent(subtask: Subtask) -> str:
        results.append(await plane.client.execute_tool(subtask.session_id, "bash", bash("rm -f keep.txt"),
                                                       agent=subtask.agent))
        return "done"

    out = await plane.client.execute_tool(sid, "task", task("md"), on_subtask=subagent)
    assert out.error is None, out.error
    [removed] = results
    assert_denied(removed)
    assert await exists(plane, sid, "/workspace/keep.txt")


async def test_grandchild_task_cannot_run_denied_bash(plane: Plane) -> None:
    agent = "---\ndescription: Nested\nmode: subagent\npermission:\n  task: allow\n  bash: allow\n---\nx\n"
    caller = {"permission": {"bash": "deny", "task": "allow"}}
    sid = await session(plane, caller, {".opencode/agent/md.md": agent})
    ran: dict[str, ToolOutcome] = {}

    async def grandchild(subtask: Subtask) -> str:
        ran["grandchild"] = await plane.client.execute_tool(subtask.session_id, "bash", bash("touch deep"),
                                                            agent=subtask.agent)
        return "deep done"

    async def child(subtask: Subtask) -> str:
        ran["child"] = await plane.client.execute_tool(subtask.session_id, "bash", bash("touch shallow"),
                                                       agent=subtask.agent)
        ran["task"] = await plane.client.execute_tool(subtask.session_id, "task", task("md"), agent=subtask.agent,
                                                      on_subtask=grandchild)
        return "child done"

    out = await plane.client.execute_tool(sid, "task", task("md"), on_subtask=child)
    assert out.error is None, out.error
    assert ran["task"].error is None, ran["task"].error  # the caller allows task: a grandchild opens
    for level in ("child", "grandchild"):
        assert_denied(ran[level])
    assert not await exists(plane, sid, "/workspace/shallow")
    assert not await exists(plane, sid, "/workspace/deep")


async def test_workspace_narrowing_is_honoured(plane: Plane) -> None:
    workspace = {
        "opencode.json": json.dumps({"permission": {"bash": {"*": "allow", "touch *": "deny"}}}),
        ".opencode/agent/careful.md": "---\nmode: subagent\npermission:\n  edit: deny\n---\nx\n",
    }
    sid = await session(plane, {"permission": {"edit": "allow"}}, workspace)
    denied = await plane.client.execute_tool(sid, "bash", bash("touch narrowed"))
    assert_denied(denied)
    assert not await exists(plane, sid, "/workspace/narrowed")
    allowed = await plane.client.execute_tool(sid, "bash", bash("echo fine > fine.txt"))
    assert allowed.error is None, allowed.error
    assert await exists(plane, sid, "/workspace/fine.txt")
    wrote: list[ToolOutcome] = []

    async def careful(subtask: Subtask) -> str:
        wrote.append(await plane.client.execute_tool(
            subtask.session_id, "write", {"filePath": "/workspace/by-careful.txt", "content": "x"},
            agent=subtask.agent,
        ))
        return "done"

    out = await plane.client.execute_tool(sid, "task", task("careful"), on_subtask=careful)
    assert out.error is None, out.error
    [write] = wrote
    assert_denied(write)
    assert not await exists(plane, sid, "/workspace/by-careful.txt")


async def test_the_workspace_cannot_pick_an_agent_the_callers_rules_do_not_cover(plane: Plane) -> None:
    """The caller confined `build` (agent-level rules) and named no agent: a workspace `default_agent`, or a
    workspace that disables `build`, would run the session as an agent those rules never reach. Refused
    at create; naming the agent, or a caller config without agent settings, still works."""
    caller = {"agent": {"build": {"permission": {"bash": "deny"}}}}
    md_primary = "---\ndescription: Mine\nmode: primary\npermission:\n  bash: allow\n---\nGo.\n"
    chosen_by_default = {"opencode.json": json.dumps({"default_agent": "md"}), ".opencode/agent/md.md": md_primary}
    build_disabled = {"opencode.json": json.dumps({"agent": {"build": {"disable": True}}})}
    for files in (chosen_by_default, build_disabled):
        with pytest.raises(Exception, match="name the session's agent in CreateSession's agent") as refused:
            await session(plane, caller, files)
        assert "INVALID_ARGUMENT" in str(refused.value), refused.value
    # The caller's own choice is kept, and then its rules hold for it.
    created = await plane.client.create_session(
        workspace_archive=tar_of(chosen_by_default), config_json=json.dumps(caller), agent="build")
    try:
        assert_denied(await plane.client.execute_tool(created.id, "bash", bash("touch /workspace/pwned")))
        assert not await exists(plane, created.id, "/workspace/pwned")
    finally:
        await plane.client.delete_session(created.id)
    # Without agent-level settings in config_json the project's default agent runs, as upstream's does.
    plain = await session(plane, {"permission": {"bash": "deny"}}, chosen_by_default)
    try:
        assert (await plane.client.get_session(plain)).agent == "md"
        assert_denied(await plane.client.execute_tool(plain, "bash", bash("touch /workspace/pwned")))
    finally:
        await plane.client.delete_session(plain)
