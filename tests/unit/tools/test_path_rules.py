"""Path rules follow the file: asks name where a path really leads, and grep/glob/list hide what a read deny covers.

The rules are the agent's own `LocalRules` over the wire format the control plane sends (ToolStart.path_rules).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.v1 import agent_pb2
from sandbox_agent.permission_rules import LocalRules
from sandbox_agent.tools import apply_patch, edit, glob, grep, lsp, read, write
from sandbox_agent.tools import list as list_tool
from sandbox_agent.tools.base import ToolContext, ToolError
from tests.unit.tools.conftest import Recorder

MakeCtx = Callable[..., ToolContext]


def _rules(*rules: tuple[str, str, str]) -> LocalRules:
    return LocalRules([agent_pb2.PermissionRule(permission=p, pattern=g, action=a) for p, g, a in rules])


READ_DENY_ENV = _rules(("*", "*", "allow"), ("read", "*.env", "deny"))


@pytest.fixture
def secret_project(project: Path) -> Path:
    (project / ".env").write_text("SECRET=hunter2\n")
    (project / "notes.txt").symlink_to(".env")
    (project / "a.txt").write_text("plain SECRET mention\n")
    os.link(project / ".env", project / "copy")
    return project


def _with_rules(make_ctx: MakeCtx, rules: LocalRules | None = READ_DENY_ENV, **extra: Any) -> ToolContext:
    ctx = make_ctx(**extra)
    ctx.rules = rules
    return ctx


async def test_read_asks_for_the_real_path_of_a_symlink(make_ctx: MakeCtx, recorder: Recorder,
                                                        secret_project: Path) -> None:
    await read.run({"filePath": str(secret_project / "a.txt")}, make_ctx())
    assert recorder.asks[-1].patterns == [str(secret_project / "a.txt")]  # upstream's shape
    recorder.deny.add("read")
    with pytest.raises(ToolError):
        await read.run({"filePath": str(secret_project / "notes.txt")}, make_ctx())
    # The real path, then the file's other hard-link name (`copy`).
    assert recorder.asks[-1].patterns == [str(secret_project / "notes.txt"), str(secret_project / ".env"),
                                          str(secret_project / "copy")]


async def test_read_asks_for_a_hard_links_other_names(make_ctx: MakeCtx, recorder: Recorder,
                                                      secret_project: Path) -> None:
    recorder.deny.add("read")
    with pytest.raises(ToolError):
        await read.run({"filePath": str(secret_project / "copy")}, make_ctx())
    assert recorder.asks[-1].patterns == [str(secret_project / "copy"), str(secret_project / ".env")]


async def test_write_and_edit_ask_for_the_real_target(make_ctx: MakeCtx, recorder: Recorder, project: Path) -> None:
    (project / "protected.txt").write_text("keep\n")
    (project / "g").symlink_to("protected.txt")
    recorder.deny.add("edit")
    ctx = make_ctx(worktree=str(project))
    await read.run({"filePath": str(project / "g")}, ctx)
    with pytest.raises(ToolError):
        await write.run({"filePath": str(project / "g"), "content": "x"}, ctx)
    assert recorder.asks[-1].patterns == ["g", "protected.txt"]
    with pytest.raises(ToolError):
        await edit.run({"filePath": str(project / "g"), "oldString": "keep", "newString": "gone"}, ctx)
    assert recorder.asks[-1].patterns == ["g", "protected.txt"]
    patch = "*** Begin Patch\n*** Update File: g\n@@\n-keep\n+gone\n*** End Patch"
    with pytest.raises(ToolError):
        await apply_patch.run({"patchText": patch}, ctx)
    assert recorder.asks[-1].patterns == ["g", "protected.txt"]
    assert (project / "protected.txt").read_text() == "keep\n"


async def test_grep_never_shows_lines_of_a_read_denied_file(make_ctx: MakeCtx, secret_project: Path) -> None:
    out = await grep.run({"pattern": "SECRET"}, _with_rules(make_ctx))
    assert "hunter2" not in out.output
    assert "a.txt" in out.output
    # Without a deny, upstream's answer (the .env lines included).
    out = await grep.run({"pattern": "hunter2"}, _with_rules(make_ctx, _rules(("*", "*", "allow"))))
    assert "hunter2" in out.output
    # Named explicitly, through the symlink: still nothing.
    out = await grep.run({"pattern": "hunter2", "path": str(secret_project / "notes.txt")}, _with_rules(make_ctx))
    assert out.output == "No files found"


async def test_glob_and_list_leave_out_read_denied_files(make_ctx: MakeCtx, secret_project: Path) -> None:
    out = await glob.run({"pattern": "*"}, _with_rules(make_ctx))
    names = {os.path.basename(line) for line in out.output.splitlines()}
    assert names == {"a.txt"}
    out = await list_tool.run({}, _with_rules(make_ctx))
    assert ".env" not in out.output
    assert "copy" not in out.output
    assert "a.txt" in out.output
    out = await glob.run({"pattern": "*"}, make_ctx())  # no rules sent: upstream's listing
    assert ".env" in out.output


async def test_instruction_files_a_deny_covers_are_not_injected(make_ctx: MakeCtx, project: Path) -> None:
    (project / ".env").write_text("SECRET=hunter2\n")
    (project / "sub").mkdir()
    (project / "sub" / "AGENTS.md").symlink_to("../.env")
    (project / "sub" / "x.txt").write_text("x\n")
    out = await read.run({"filePath": str(project / "sub" / "x.txt")}, _with_rules(make_ctx))
    assert "hunter2" not in out.output
    out = await read.run({"filePath": str(project / "sub" / "x.txt")},
                         _with_rules(make_ctx, _rules(("*", "*", "allow")), state=None))
    assert "hunter2" in out.output  # allowed: upstream's instruction loading


async def test_lsp_does_not_open_a_read_denied_file(make_ctx: MakeCtx, secret_project: Path) -> None:
    args = {"operation": "hover", "filePath": str(secret_project / "notes.txt"), "line": 1, "character": 1}
    with pytest.raises(ToolError, match="a read rule of this session denies it"):
        await lsp.run(args, _with_rules(make_ctx))
