"""The read tool's instruction files (AGENTS.md and the like): injected once per session, never for themselves,
skipped when empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_agent.tools import read
from sandbox_agent.tools.base import SessionState, ToolError
from tests.unit.tools.read_support import MakeCtx, envelope


def _instruction_tree(project: Path) -> Path:
    deep = project / "pkg" / "mod"
    deep.mkdir(parents=True)
    (project / "AGENTS.md").write_text("root rules")  # the project's own file is the system prompt's business
    (project / "pkg" / "CLAUDE.md").write_text("pkg claude")
    (project / "pkg" / "CONTEXT.md").write_text("pkg context")  # CLAUDE.md comes first
    (project / "pkg" / "mod" / "AGENTS.md").write_text("mod rules\n")
    (deep / "code.py").write_text("print(1)\n")
    return deep / "code.py"


async def test_instructions_injected_once_per_session(make_ctx: MakeCtx, project: Path) -> None:
    target = _instruction_tree(project)
    ctx = make_ctx()
    result = await read.run({"filePath": str(target)}, ctx)
    mod, pkg = str(project / "pkg" / "mod" / "AGENTS.md"), str(project / "pkg" / "CLAUDE.md")
    assert result.output == envelope(target, "1: print(1)\n\n(End of file - total 1 lines)") + (
        f"\n\n<system-reminder>\nInstructions from: {mod}\nmod rules\n\n\n"
        f"Instructions from: {pkg}\npkg claude\n</system-reminder>")
    assert result.metadata["loaded"] == [mod, pkg]
    assert ctx.state.loaded_instructions == {mod, pkg}

    again = await read.run({"filePath": str(target)}, make_ctx())
    assert "<system-reminder>" not in again.output
    assert again.metadata["loaded"] == []

    # A new session starts over.
    fresh = await read.run({"filePath": str(target)}, make_ctx(state=SessionState()))
    assert fresh.metadata["loaded"] == [mod, pkg]


async def test_instruction_file_itself_is_not_injected(make_ctx: MakeCtx, project: Path) -> None:
    _instruction_tree(project)
    agents = project / "pkg" / "mod" / "AGENTS.md"
    result = await read.run({"filePath": str(agents)}, make_ctx())
    assert result.metadata["loaded"] == [str(project / "pkg" / "CLAUDE.md")]


async def test_no_instructions_for_root_files_outside_files_or_failures(make_ctx: MakeCtx, project: Path,
                                                                    tmp_path: Path) -> None:
    _instruction_tree(project)
    (project / "top.txt").write_text("x")
    ctx = make_ctx()
    assert (await read.run({"filePath": str(project / "top.txt")}, ctx)).metadata["loaded"] == []
    (tmp_path / "AGENTS.md").write_text("outside")
    (tmp_path / "o.txt").write_text("x")
    assert (await read.run({"filePath": str(tmp_path / "o.txt")}, ctx)).metadata["loaded"] == []
    (project / "pkg" / "mod" / "blob.bin").write_bytes(b"\x00")
    with pytest.raises(ToolError):
        await read.run({"filePath": str(project / "pkg" / "mod" / "blob.bin")}, ctx)
    assert ctx.state.loaded_instructions == set()


async def test_empty_instruction_file_is_skipped(make_ctx: MakeCtx, project: Path) -> None:
    (project / "d").mkdir()
    (project / "d" / "AGENTS.md").write_text("")
    (project / "d" / "CLAUDE.md").write_text("never reached: AGENTS.md exists")
    (project / "d" / "f.txt").write_text("x")
    result = await read.run({"filePath": str(project / "d" / "f.txt")}, make_ctx())
    assert result.metadata["loaded"] == []
    assert "<system-reminder>" not in result.output
