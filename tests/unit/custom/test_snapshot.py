"""The session's code snapshot (sandbox_agent.custom.snapshot) and the manager loading only from it.

Run as the current user (no uid separation here: the Docker tests in tests/security/test_code_snapshot.py
show the tool user cannot change the copy); these pin down what is copied, how, and what a reload reports.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox_agent.custom import snapshot
from sandbox_agent.custom.manager import CustomTools
from sandbox_agent.tools.runner import ToolRunner

PY_TOOL = '''from opencode_tool import tool


async def run(args, ctx):
    return "{answer}"

default = tool(description="{answer}", args={{"type": "object", "properties": {{}}}}, execute=run)
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / ".opencode" / "tool").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    (tmp_path / "code").mkdir()
    return project


async def take(runner: ToolRunner, project: Path, config: dict[str, object] | None = None) -> snapshot.CodeSnapshot:
    return await snapshot.take(runner, base=str(project.parent / "code"), workspace=str(project),
                               worktree=str(project), home=str(project.parent / "home"), config=config or {}, env={})


async def test_the_config_dir_is_mirrored_links_followed_and_special_files_left_out(
    runner: ToolRunner, project: Path,
) -> None:
    opencode = project / ".opencode"
    (opencode / "tool" / "a.ts").write_text("export {}\n")
    (opencode / "lib").mkdir()
    (opencode / "lib" / "util.ts").write_text("export const x = 1\n")
    (opencode / "node_modules" / "dep").mkdir(parents=True)
    (opencode / "node_modules" / "dep" / "index.js").write_text("module.exports = 1\n")
    outside = project / "src.ts"
    outside.write_text("export const y = 2\n")
    (opencode / "tool" / "linked.ts").symlink_to(outside)
    (opencode / "loop").symlink_to(opencode)
    os.mkfifo(opencode / "tool" / "pipe.ts")
    (project / "plugin.ts").write_text("export const P = async () => ({})\n")

    code = await take(runner, project, {"plugin": ["./plugin.ts", "some-npm-plugin"]})
    try:
        check_mirror(code, project)
    finally:
        snapshot.remove(code.root)
    assert not await asyncio.to_thread(os.path.exists, code.root)


def check_mirror(code: snapshot.CodeSnapshot, project: Path) -> None:
    opencode = project / ".opencode"
    root = Path(code.root)
    assert root.parent == project.parent / "code"
    assert root.stat().st_mode & 0o777 == 0o755
    copy = Path(code.inside(str(opencode)))
    assert copy == Path(code.root + str(opencode))
    assert (copy / "tool" / "a.ts").read_text() == "export {}\n"
    assert (copy / "lib" / "util.ts").read_text() == "export const x = 1\n"
    assert (copy / "node_modules" / "dep" / "index.js").is_file()
    # A link is copied as the file it points to: the copy never leads back into the workspace.
    linked = copy / "tool" / "linked.ts"
    assert not linked.is_symlink()
    assert linked.read_text() == "export const y = 2\n"
    assert (copy / "tool" / "a.ts").stat().st_mode & 0o777 == 0o644
    assert not (copy / "tool" / "pipe.ts").exists()
    assert not (copy / "loop" / "loop").exists()
    # A file the config names outside the config dirs is copied; npm specs stay as they are.
    assert code.plugin_specs == [code.root + str(project / "plugin.ts"), "some-npm-plugin"]
    assert Path(code.plugin_specs[0]).read_text() == "export const P = async () => ({})\n"
    assert not (Path(code.root + str(project)) / "src.ts").exists()
    assert code.outside(f"Cannot find module from {copy}/tool/a.ts") == f"Cannot find module from {opencode}/tool/a.ts"
    assert str(opencode / "tool" / "a.ts") in code.files


async def test_changes_between_two_snapshots(runner: ToolRunner, project: Path) -> None:
    tools = project / ".opencode" / "tool"
    (tools / "keep.ts").write_text("1")
    (tools / "edit.ts").write_text("1")
    (tools / "drop.ts").write_text("1")
    skill = project / ".opencode" / "skill" / "s"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: s\ndescription: d\n---\nbody\n")
    first = await take(runner, project)
    assert [s.name for s in first.skills.skills] == ["s"]
    (tools / "edit.ts").write_text("2")
    (tools / "drop.ts").unlink()
    (tools / "new.ts").write_text("1")
    second = await take(runner, project)
    try:
        found = snapshot.changes(first, second)
        assert found.added == [str(tools / "new.ts")]
        assert found.changed == [str(tools / "edit.ts")]
        assert found.removed == [str(tools / "drop.ts")]
        assert snapshot.changes(None, first).added == sorted(first.files)
    finally:
        snapshot.remove(first.root)
        snapshot.remove(second.root)


async def test_too_much_code_is_refused_with_the_reason(
    runner: ToolRunner, project: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshot, "MAX_FILES", 2)
    for name in "abc":
        (project / ".opencode" / "tool" / f"{name}.ts").write_text("x")
    with pytest.raises(snapshot.SnapshotError, match=r"holds more than 2 files or \d+ bytes"):
        await take(runner, project)
    assert list((project.parent / "code").iterdir()) == []  # nothing left behind


async def test_a_link_to_the_root_is_walked_only_up_to_the_limit(
    runner: ToolRunner, project: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshot, "MAX_FILES", 500)
    (project / ".opencode" / "everything").symlink_to("/")
    with pytest.raises(snapshot.SnapshotError, match="links to big directories"):
        await asyncio.wait_for(take(runner, project), 30)


async def test_a_base_that_cannot_hold_the_copy_is_a_clear_error(runner: ToolRunner, project: Path) -> None:
    blocker = project.parent / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(snapshot.SnapshotError, match="could not"):
        await snapshot.take(runner, base=str(blocker / "sub"), workspace=str(project), worktree=str(project),
                            home=str(project.parent / "home"), config={}, env={})


async def test_a_private_base_with_a_tool_writable_ancestor_is_refused(runner: ToolRunner, project: Path) -> None:
    """In a container the snapshot goes to the providers' root-owned tmpfs; anywhere a tool process could plant
    a node_modules or tsconfig.json above the copy (here the sticky /tmp above pytest's dir) is refused."""
    base = project.parent / "code"
    base.mkdir(exist_ok=True)
    base.chmod(0o777)
    with pytest.raises(snapshot.SnapshotError, match="refusing to keep the session's custom code under") as info:
        await snapshot.take(runner, base=str(base), workspace=str(project), worktree=str(project),
                            home=str(project.parent / "home"), config={}, env={}, private=True)
    assert "could be written by a tool process" in str(info.value)
    assert list(base.iterdir()) == []  # nothing was copied
    with pytest.raises(snapshot.SnapshotError, match="/tmp could be written"):
        snapshot.check_private("/tmp")  # sticky and world-writable
    snapshot.check_private("/usr")  # root's, 0755 up to the root: accepted


@pytest.fixture
async def custom(runner: ToolRunner, project: Path) -> AsyncIterator[CustomTools]:
    tools = CustomTools(runner, str(project), str(project.parent / "home"), code_dir=str(project.parent / "code"))
    yield tools
    await tools.close()


async def test_the_manager_loads_only_from_the_snapshot(custom: CustomTools, project: Path) -> None:
    tool_file = project / ".opencode" / "tool" / "answer.py"
    tool_file.write_text(PY_TOOL.format(answer="shipped"))
    await custom.take_snapshot({}, {}, str(project))
    listing = await custom.listing({}, {}, str(project))
    assert [(t.id, t.description, t.origin) for t in listing.tools] == [("answer", "shipped", str(tool_file))], listing

    # Written after the snapshot: workspace data, never loaded.
    tool_file.write_text(PY_TOOL.format(answer="rewritten"))
    (project / ".opencode" / "tool" / "late.py").write_text(PY_TOOL.format(answer="late"))
    listing = await custom.listing({}, {}, str(project))
    assert [(t.id, t.description) for t in listing.tools] == [("answer", "shipped")]

    found = await custom.take_snapshot({}, {}, str(project))
    assert found.added == [str(project / ".opencode" / "tool" / "late.py")]
    assert found.changed == [str(tool_file)]
    listing = await custom.listing({}, {}, str(project))
    assert [(t.id, t.description) for t in listing.tools] == [("answer", "rewritten"), ("late", "late")]
    assert custom.snapshot is not None
    assert len(list((project.parent / "code").iterdir())) == 1  # the old copy is gone


async def test_without_a_snapshot_the_first_listing_takes_one(custom: CustomTools, project: Path) -> None:
    (project / ".opencode" / "tool" / "answer.py").write_text(PY_TOOL.format(answer="first"))
    listing = await custom.listing({}, {}, str(project))
    assert [t.id for t in listing.tools] == ["answer"]
    assert custom.snapshot is not None
    assert custom.snapshot.root.startswith(str(project.parent / "code"))
