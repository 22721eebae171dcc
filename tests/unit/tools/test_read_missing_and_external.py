"""The read tool on paths that are missing or lead outside the project: not-found suggestions, the
external_directory ask (also through a symlink), and denied reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_agent.tools import read
from sandbox_agent.tools.base import ToolError
from tests.unit.tools.read_support import MakeCtx

from .conftest import Asked, Recorder


async def test_missing_file(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "nope.txt")}, make_ctx())
    assert str(err.value) == f"File not found: {project / 'nope.txt'}"
    # The read permission is asked before existence is checked.
    assert recorder.asks == [Asked("read", [str(project / "nope.txt")], ["*"], {})]


async def test_missing_file_suggestions(make_ctx: MakeCtx, project: Path) -> None:
    for name in ["Config.json", "config.json.bak", "other.txt"]:
        (project / name).write_text("x")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "config.json")}, make_ctx())
    message = str(err.value)
    head, _, tail = message.partition("\n\nDid you mean one of these?\n")
    assert head == f"File not found: {project / 'config.json'}"
    assert sorted(tail.split("\n")) == sorted([str(project / "Config.json"), str(project / "config.json.bak")])

    # The name contained in the missing one also counts ("conf" is in "conf.d.txt"); at most 3.
    for name in ["conf", "conf.d", "conf.d.txt.old", "CONF.D.TXT2"]:
        (project / name).write_text("x")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "conf.d.txt")}, make_ctx())
    suggestions = str(err.value).split("Did you mean one of these?\n")[1].split("\n")
    assert len(suggestions) == 3
    allowed = {str(project / n) for n in ["conf", "conf.d", "conf.d.txt.old", "CONF.D.TXT2"]}
    assert set(suggestions) <= allowed


async def test_missing_in_missing_directory(make_ctx: MakeCtx, project: Path) -> None:
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "no" / "such.txt")}, make_ctx())
    assert str(err.value) == f"File not found: {project / 'no' / 'such.txt'}"


async def test_external_file_asks_for_its_directory(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("hi\n")
    await read.run({"filePath": str(outside / "f.txt")}, make_ctx())
    glob = f"{outside}/*"
    assert recorder.asks == [
        Asked("external_directory", [glob], [glob], {"filepath": str(outside / "f.txt"), "parentDir": str(outside)}),
        Asked("read", [str(outside / "f.txt")], ["*"], {}),
    ]


async def test_external_directory_kind(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    await read.run({"filePath": str(outside)}, make_ctx())
    glob = f"{outside}/*"
    assert recorder.asks[0] == Asked("external_directory", [glob], [glob],
                                     {"filepath": str(outside), "parentDir": str(outside)})


async def test_external_missing_file_asks_before_not_found(make_ctx: MakeCtx, tmp_path: Path,
                                                         recorder: Recorder) -> None:
    with pytest.raises(ToolError, match=r"^File not found: "):
        await read.run({"filePath": str(tmp_path / "ghost.txt")}, make_ctx())
    assert [a.permission for a in recorder.asks] == ["external_directory", "read"]


async def test_external_denied(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    recorder.deny.add("external_directory")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ToolError, match="rejected"):
        await read.run({"filePath": str(tmp_path / "f.txt")}, make_ctx())
    assert [a.permission for a in recorder.asks] == ["external_directory"]


async def test_bypass_cwd_check(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    (tmp_path / "f.txt").write_text("x")
    await read.run({"filePath": str(tmp_path / "f.txt")}, make_ctx(bypassCwdCheck=True))
    assert [a.permission for a in recorder.asks] == ["read"]


async def test_worktree_counts_as_inside(make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    (tmp_path / "f.txt").write_text("x")
    await read.run({"filePath": str(tmp_path / "f.txt")}, make_ctx(worktree=str(tmp_path)))
    assert [a.permission for a in recorder.asks] == ["read"]


async def test_read_denied(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    recorder.deny.add("read")
    (project / "f.txt").write_text("x")
    with pytest.raises(ToolError, match="rejected"):
        await read.run({"filePath": str(project / "f.txt")}, make_ctx())


async def test_a_workspace_symlink_leading_out_asks_for_where_it_really_goes(
    make_ctx: MakeCtx, project: Path, tmp_path: Path, recorder: Recorder,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s\n")
    (project / "link").symlink_to(outside)
    (project / "inner").mkdir()
    (project / "inner_link").symlink_to(project / "inner")
    (project / "inner" / "ok.txt").write_text("ok\n")
    await read.run({"filePath": str(project / "inner_link" / "ok.txt")}, make_ctx())
    assert [a.permission for a in recorder.asks] == ["read"]  # a link that stays inside asks nothing more
    recorder.asks.clear()
    await read.run({"filePath": str(project / "link" / "secret.txt")}, make_ctx())
    glob = f"{outside}/*"
    assert recorder.asks[0] == Asked(
        "external_directory", [glob], [glob], {"filepath": str(outside / "secret.txt"), "parentDir": str(outside)},
    )
