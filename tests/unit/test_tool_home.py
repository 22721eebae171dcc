"""The tool user's HOME as the agent makes it at start, in its own process (tool_home.make): upstream's state dirs,
private to their owner, and the cache version file; the Docker test (tests/docker/test_tool_home.py) checks the
owner in a real sandbox."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox_agent import tool_home


def test_home_and_every_state_dir_are_private_and_the_version_is_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tool_home.make(str(home))
    made = [home, *(home / d for d in tool_home.STATE_DIRS), home / ".local", home / ".local/share",
            home / ".config", home / ".local/state", home / ".cache"]
    for directory in made:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    version = home / ".cache/opencode/version"
    assert version.read_text() == tool_home.CACHE_VERSION
    assert stat.S_IMODE(version.stat().st_mode) == 0o600


def test_making_it_again_keeps_what_is_there(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tool_home.make(str(home))
    (home / ".config/opencode/notes.db").write_text("kept")
    tool_home.make(str(home) + "/")
    assert (home / ".config/opencode/notes.db").read_text() == "kept"


def test_a_file_where_a_dir_belongs_fails_the_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".local").mkdir(parents=True)
    (home / ".local/share").write_text("not a dir")
    with pytest.raises(FileExistsError):
        tool_home.make(str(home))


def test_the_version_file_is_never_written_through_a_link(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".cache/opencode").mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    os.symlink(target, home / ".cache/opencode/version")
    with pytest.raises(OSError, match="symbolic links"):  # ELOOP: O_NOFOLLOW
        tool_home.make(str(home))
    assert target.read_text() == "untouched"
