"""Reference §5 external_directory: when it asks, for which glob, with which metadata (edge cases)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.tools.base import SessionState, ToolContext
from sandbox_agent.tools.paths import assert_external_directory
from sandbox_agent.tools.runner import local_runner

Asked = tuple[str, list[str], list[str], dict[str, Any]]


async def asks_for(project: Path, target: str | None, *, kind: str = "file", worktree: str = "/",
                   bypass: bool = False) -> list[Asked]:
    asked: list[Asked] = []

    async def ask(permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any]) -> None:
        asked.append((permission, list(patterns), list(always), dict(metadata)))

    async def metadata(*_: Any) -> None:
        return None

    runner = local_runner()
    try:
        ctx = ToolContext(
            session_id="s", message_id="m", call_id="c", agent="build", directory=str(project), worktree=worktree,
            ask=ask, metadata=metadata, runner=runner, state=SessionState(), abort=asyncio.Event(),
        )
        await assert_external_directory(ctx, target, kind=kind, bypass=bypass)
    finally:
        runner.close()
    return asked


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "w"
    (root / "src").mkdir(parents=True)
    return root


async def test_inside_the_project_asks_nothing(project: Path) -> None:
    for target in (str(project), f"{project}/src/a.py", f"{project}/src/../b", f"{project}/new/dir/x"):
        assert await asks_for(project, target) == []
    assert await asks_for(project, None) == []
    assert await asks_for(project, "") == []
    assert await asks_for(project, "/etc/passwd", bypass=True) == []


async def test_a_file_outside_asks_for_its_directory_glob(project: Path) -> None:
    assert await asks_for(project, "/etc/passwd") == [
        ("external_directory", ["/etc/*"], ["/etc/*"], {"filepath": "/etc/passwd", "parentDir": "/etc"}),
    ]


async def test_a_directory_outside_asks_for_itself(project: Path) -> None:
    assert await asks_for(project, "/etc", kind="directory") == [
        ("external_directory", ["/etc/*"], ["/etc/*"], {"filepath": "/etc", "parentDir": "/etc"}),
    ]
    assert await asks_for(project, "/", kind="directory") == [
        ("external_directory", ["/*"], ["/*"], {"filepath": "/", "parentDir": "/"}),
    ]


async def test_a_sibling_sharing_the_projects_prefix_is_outside(project: Path) -> None:
    sibling = f"{project}2/x.txt"
    assert await asks_for(project, sibling) == [
        ("external_directory", [f"{project}2/*"], [f"{project}2/*"], {"filepath": sibling, "parentDir": f"{project}2"}),
    ]


async def test_dot_dot_segments_are_resolved_in_the_glob_but_kept_in_the_metadata(project: Path) -> None:
    target = f"{project}/src/../../etc/x"
    parent = f"{project}/src/../../etc"
    glob = f"{project.parent}/etc/*"
    assert await asks_for(project, target) == [
        ("external_directory", [glob], [glob], {"filepath": target, "parentDir": parent}),
    ]


async def test_a_name_starting_with_two_dots_counts_as_outside_as_upstream(project: Path) -> None:
    # path.relative gives "..cache", which starts with ".."; upstream asks for it too.
    target = f"{project}/..cache"
    assert await asks_for(project, target) == [
        ("external_directory", [f"{project}/*"], [f"{project}/*"], {"filepath": target, "parentDir": str(project)}),
    ]


async def test_the_git_worktree_counts_but_a_root_worktree_does_not(project: Path) -> None:
    outside = f"{project.parent}/other/x"
    assert await asks_for(project, outside, worktree=str(project.parent)) == []
    assert len(await asks_for(project, outside, worktree="/")) == 1


async def test_a_trailing_slash_is_not_an_empty_last_component(project: Path) -> None:
    assert await asks_for(project, "/opt/data/") == [
        ("external_directory", ["/opt/*"], ["/opt/*"], {"filepath": "/opt/data/", "parentDir": "/opt"}),
    ]
