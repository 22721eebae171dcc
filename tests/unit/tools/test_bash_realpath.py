"""bash's outside-the-project check: path arguments resolve as GNU `realpath` does (reference §6 bash)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent.tools import bash
from sandbox_agent.tools.base import ToolContext, ToolError
from sandbox_agent.tools.bash_scan import realpath_command, scan

from .conftest import Asked, Recorder

MakeCtx = Callable[..., ToolContext]


def test_new_file_outside_asks_for_its_parent(project: Path, outside: Path) -> None:
    # `realpath /x/new` succeeds when /x exists: upstream then asks for /x.
    found = scan(f"touch {outside}/new.txt", str(project), str(project), "/")
    assert found.external_dirs == [str(outside)]


def test_new_directory_outside_asks_for_its_parent(project: Path, outside: Path) -> None:
    found = scan(f"mkdir {outside}/fresh/ && cp a.txt {outside}/dir/new.txt", str(project), str(project), "/")
    assert found.external_dirs == [str(outside), str(outside / "dir")]


def test_missing_parent_asks_nothing(project: Path, outside: Path) -> None:
    found = scan(f"mkdir -p {outside}/a/b/c; rm {outside}/nope/x", str(project), str(project), "/")
    assert found.external_dirs == []


def test_new_path_inside_asks_nothing(project: Path) -> None:
    assert scan("touch new.txt && mkdir sub", str(project), str(project), "/").external_dirs == []


def test_dotdot_is_resolved_after_symlinks(project: Path, outside: Path) -> None:
    # `link/..` is the parent of where link points (outside), not the project itself.
    os.symlink(outside / "dir", project / "link")
    found = scan("cd link/..", str(project), str(project), "/")
    assert found.external_dirs == [str(outside)]


@pytest.mark.skipif(shutil.which("realpath") is None, reason="needs coreutils realpath")
@pytest.mark.parametrize(
    "arg",
    ["{out}/new.txt", "{out}/file.txt", "{out}/file.txt/", "{out}/dir/", "{out}/nope/x", "{out}/nope/..",
     "{out}/dir/../file.txt", "dangling", "dangling_far", "new_here", ".", "..", "/", "sub/../../x"],
)
def test_realpath_command_agrees_with_coreutils(arg: str, project: Path, outside: Path) -> None:
    os.symlink(outside / "gone", project / "dangling")
    os.symlink("/definitely/not/here", project / "dangling_far")
    (project / "sub").mkdir()
    text = arg.format(out=outside)
    done = subprocess.run(["realpath", text], cwd=project, capture_output=True, text=True, check=False)
    expected = done.stdout.strip() if done.returncode == 0 else None
    assert realpath_command(os.path.join(project, text)) == expected


async def test_touch_outside_asks_external_directory_then_bash(make_ctx: MakeCtx, outside: Path,
                                                               recorder: Recorder) -> None:
    recorder.deny.add("external_directory")
    with pytest.raises(ToolError):
        await bash.run({"command": f"touch {outside}/made.txt", "description": "d"}, make_ctx())
    assert not (outside / "made.txt").exists()
    assert recorder.asks == [Asked("external_directory", [f"{outside}/*"], [f"{outside}/*"], {})]
