"""A workspace's own project config (opencode.json(c), markdown agents) shapes its session, read once at create."""

from __future__ import annotations

import grpc
import pytest

from tests.archives import tar_of
from tests.planes import Plane

PROJECT = {
    "opencode.jsonc": '{\n  // the project\'s own rules\n  "permission": {"bash": {"rm *": "deny",},},\n}\n',
    ".opencode/agent/reviewer.md": (
        "---\n"
        "description: Reviews changes: reads, never writes\n"
        "mode: subagent\n"
        "tools:\n"
        "  write: false\n"
        "  edit: false\n"
        "---\n"
        "\n"
        "You review the diff you are given.\n"
    ),
    ".opencode/agents/docs/writer.md": "---\ndescription: Writes documentation\nmode: subagent\n---\nWrite docs.\n",
    ".opencode/mode/focus.md": "---\ndescription: Focused work\n---\nStay on task.\n",
}


@pytest.fixture
def plane(either_plane: Plane) -> Plane:
    return either_plane


async def task_description(plane: Plane, session_id: str) -> str:
    listed = await plane.client.list_tools(session_id)
    return next(t.description for t in listed.tools if t.id == "task")


async def test_markdown_agents_and_jsonc_rules_from_the_workspace_apply(plane: Plane) -> None:
    session = await plane.client.create_session(workspace_archive=tar_of(PROJECT))
    try:
        description = await task_description(plane, session.id)
        assert "- reviewer: Reviews changes: reads, never writes\n" in description
        assert "- docs/writer: Writes documentation\n" in description
        assert "focus" not in description  # a mode file's agent is primary: not offered to the task tool

        denied = await plane.client.execute_tool(
            session.id, "write", {"filePath": "notes.txt", "content": "x"}, agent="reviewer",
        )
        assert denied.error is not None
        assert "prevents you from using this specific tool call" in denied.error

        blocked = await plane.client.execute_tool(
            session.id, "bash", {"command": "rm -f nothing.txt", "description": "Removes a file"},
        )
        assert blocked.error is not None
        assert "prevents you" in blocked.error

        written = await plane.client.execute_tool(
            session.id, "write", {"filePath": "notes.txt", "content": "x"}, agent="focus",
        )
        assert written.error is None, written.error
    finally:
        await plane.client.delete_session(session.id)


async def test_agent_files_written_during_the_session_change_nothing(plane: Plane) -> None:
    session = await plane.client.create_session(workspace_archive=tar_of(PROJECT))
    try:
        # A tool call may write into .opencode/; the session's config was read at create and stays.
        late = "---\ndescription: Added later\nmode: subagent\npermission: allow\n---\nAnything goes.\n"
        out = await plane.client.execute_tool(
            session.id, "write", {"filePath": ".opencode/agent/late.md", "content": late},
        )
        assert out.error is None, out.error
        relaxed = "---\ndescription: Reviews\nmode: subagent\n---\n"
        await plane.client.execute_tool(session.id, "read", {"filePath": ".opencode/agent/reviewer.md"})
        out = await plane.client.execute_tool(
            session.id, "write", {"filePath": ".opencode/agent/reviewer.md", "content": relaxed},
        )
        assert out.error is None, out.error
        assert "- late:" not in await task_description(plane, session.id)
        denied = await plane.client.execute_tool(
            session.id, "write", {"filePath": "notes.txt", "content": "x"}, agent="reviewer",
        )
        assert denied.error is not None
        assert "prevents you" in denied.error
    finally:
        await plane.client.delete_session(session.id)


async def test_config_json_is_the_top_layer_and_may_be_jsonc(plane: Plane) -> None:
    config = '{\n  // the caller has the last word\n  "agent": {"reviewer": {"description": "Caller\'s words",},},\n}'
    session = await plane.client.create_session(workspace_archive=tar_of(PROJECT), config_json=config)
    try:
        assert "- reviewer: Caller's words\n" in await task_description(plane, session.id)
    finally:
        await plane.client.delete_session(session.id)


async def test_a_broken_agent_file_refuses_the_session_and_names_the_file(plane: Plane) -> None:
    before = {s.id for s in (await plane.client.list_sessions())}
    broken = {**PROJECT, ".opencode/agent/bad.md": "---\nmode: sometimes\n---\nHm.\n"}
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plane.client.create_session(workspace_archive=tar_of(broken))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        'workspace .opencode/agent/bad.md: `mode` must be primary, subagent or all, not "sometimes"'
    )
    assert {s.id for s in (await plane.client.list_sessions())} == before


async def test_a_file_reference_is_read_from_the_archive(plane: Plane) -> None:
    files = {
        ".opencode/opencode.json": '{"agent": {"helper": {"mode": "subagent", '
                                   '"description": "{file:../docs/helper.txt}"}}}',
        "docs/helper.txt": "Answers questions about the docs\n",
    }
    session = await plane.client.create_session(workspace_archive=tar_of(files))
    try:
        assert "- helper: Answers questions about the docs\n" in await task_description(plane, session.id)
    finally:
        await plane.client.delete_session(session.id)


async def test_a_project_that_replaces_build_runs_its_own_primary_agent(plane: Plane) -> None:
    files = {
        "opencode.json": '{"agent": {"build": {"disable": true}, "plan": {"disable": true}}}',
        ".opencode/agent/dev.md": "---\nmode: primary\npermission:\n  bash: deny\n---\nDevelop.\n",
    }
    session = await plane.client.create_session(workspace_archive=tar_of(files))
    try:
        assert session.agent == "dev"
        out = await plane.client.execute_tool(session.id, "bash", {"command": "true", "description": "Nothing"})
        assert out.error is not None
        assert "prevents you" in out.error
    finally:
        await plane.client.delete_session(session.id)
