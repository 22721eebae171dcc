"""safe_open: a path resolved once is the file opened; a swapped link or file stops the operation."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sandbox_agent.tools import safe_open
from sandbox_agent.tools.safe_open import (
    MakeDirError,
    PathChangedError,
    TooManyLinksError,
    inspect,
    open_checked,
    read_bytes,
    unlink_checked,
    write_bytes,
)


def test_an_ordinary_path_has_no_extra_spellings(project: Path) -> None:
    (project / "a.txt").write_text("a")
    target = inspect(str(project / "a.txt"), str(project))
    assert target.spellings == []
    assert target.names == [str(project / "a.txt")]
    # An unnormalised spelling of the same file is not a different file.
    assert inspect(f"{project}/./a.txt", str(project)).spellings == []


def test_an_unnormalised_spelling_is_checked_by_its_normal_form(project: Path) -> None:
    (project / "sub").mkdir()
    (project / "a.txt").write_text("a")
    for spelled in (f"{project}/./a.txt", f"{project}//a.txt", f"{project}/sub/../a.txt"):
        target = inspect(spelled, str(project))
        assert target.shown == [spelled]  # the ask shows the path as given (upstream's shape)
        assert target.respellings == [str(project / "a.txt")]  # and the rules meet the file it reaches
        assert target.names == [spelled, str(project / "a.txt")]
    assert inspect(str(project / "a.txt"), str(project)).respellings == []


def test_a_path_the_kernel_refuses_reaches_nothing(project: Path) -> None:
    """realpath reads `a.txt/.` and `missing/../a.txt` as `a.txt`; the kernel refuses both."""
    (project / "a.txt").write_text("a")
    assert inspect(f"{project}/a.txt/.", str(project)).error == errno.ENOTDIR
    assert inspect(f"{project}/a.txt/x/..", str(project)).error == errno.ENOTDIR
    assert inspect(f"{project}/missing/../a.txt", str(project)).error == errno.ENOENT
    assert inspect(f"{project}/a.txt/.", str(project)).identity is None


def test_a_symlink_adds_its_real_path(project: Path) -> None:
    (project / ".env").write_text("SECRET=1\n")
    (project / "notes.txt").symlink_to(".env")
    (project / "dir").mkdir()
    (project / "via").symlink_to("dir")
    assert inspect(str(project / "notes.txt"), str(project)).spellings == [str(project / ".env")]
    # A file that does not exist yet below a linked directory: the real directory, the name kept.
    assert inspect(str(project / "via" / "new.txt"), str(project)).spellings == [str(project / "dir" / "new.txt")]


def test_hard_links_in_the_workspace_are_found(project: Path) -> None:
    (project / ".env").write_text("SECRET=1\n")
    (project / "sub").mkdir()
    os.link(project / ".env", project / "sub" / "notes")
    target = inspect(str(project / "sub" / "notes"), str(project))
    assert target.spellings == [str(project / ".env")]


def test_a_link_scan_cut_by_its_bound_refuses(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(20):
        (project / f"f{i:02d}").write_text("x")
    (project / "zz").mkdir()
    (project / "zz" / ".env").write_text("SECRET=1\n")
    os.link(project / "zz" / ".env", project / "notes")
    monkeypatch.setattr(safe_open, "LINK_SCAN_LIMIT", 5)
    with pytest.raises(TooManyLinksError, match="other hard link"):
        inspect(str(project / "notes"), str(project))


def test_reading_after_a_swap_to_another_file_stops(project: Path) -> None:
    (project / "a.txt").write_text("mine\n")
    (project / "secret").write_text("SECRET\n")
    target = inspect(str(project / "a.txt"), str(project))
    os.replace(project / "secret", project / "a.txt")  # another inode under the checked name
    with pytest.raises(PathChangedError):
        read_bytes(target)


def test_a_directory_swapped_for_a_symlink_is_not_followed(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("outside\n")
    (project / "d").mkdir()
    (project / "d" / "a.txt").write_text("inside\n")
    target = inspect(str(project / "d" / "a.txt"), str(project))
    os.rename(project / "d", project / "d.old")
    (project / "d").symlink_to(outside)
    with pytest.raises(PathChangedError):
        read_bytes(target)
    with pytest.raises(PathChangedError):
        write_bytes(target, b"written\n")
    assert (outside / "a.txt").read_text() == "outside\n"


def test_a_write_through_a_flipped_link_writes_the_checked_file(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    (project / "a.txt").write_text("inside\n")
    (project / "f").symlink_to("a.txt")
    target = inspect(str(project / "f"), str(project))
    (project / "f").unlink()
    (project / "f").symlink_to(outside)  # flipped after the check
    write_bytes(target, b"new\n")
    assert (project / "a.txt").read_text() == "new\n"
    assert outside.read_text() == "outside\n"


def test_a_swapped_in_file_is_never_truncated(project: Path) -> None:
    (project / "a.txt").write_text("mine\n")
    (project / "protected.txt").write_text("keep\n")
    target = inspect(str(project / "a.txt"), str(project))
    os.unlink(project / "a.txt")
    os.link(project / "protected.txt", project / "a.txt")
    with pytest.raises(PathChangedError):
        write_bytes(target, b"overwritten\n")
    assert (project / "protected.txt").read_text() == "keep\n"


def test_a_missing_file_is_created_exclusively(project: Path) -> None:
    target = inspect(str(project / "new" / "deep" / "x.txt"), str(project))
    assert target.identity is None
    write_bytes(target, b"made\n")
    assert (project / "new" / "deep" / "x.txt").read_text() == "made\n"
    # Something appeared there after the check: stop rather than write into it.
    later = inspect(str(project / "y.txt"), str(project))
    (project / "y.txt").write_text("raced\n")
    with pytest.raises(PathChangedError):
        write_bytes(later, b"x")
    assert (project / "y.txt").read_text() == "raced\n"


def test_errors_name_the_path_as_shown(project: Path) -> None:
    (project / "plain.txt").write_text("p")
    with pytest.raises(MakeDirError) as made:
        write_bytes(inspect(str(project / "plain.txt" / "sub" / "x"), str(project)), b"x")
    assert made.value.directory == str(project / "plain.txt" / "sub")
    target = inspect(str(project / "gone.txt"), str(project))
    # Nothing was there at check time: an open can only find a file that appeared since.
    (project / "gone.txt").write_text("x")
    with pytest.raises(PathChangedError):
        open_checked(target, os.O_RDONLY)


def test_unlink_removes_only_the_checked_file(project: Path) -> None:
    (project / "a.txt").write_text("a")
    (project / "b.txt").write_text("b")
    target = inspect(str(project / "a.txt"), str(project))
    os.replace(project / "b.txt", project / "a.txt")
    with pytest.raises(PathChangedError):
        unlink_checked(target)
    assert (project / "a.txt").read_text() == "b"


def test_a_trailing_slash_on_a_file_is_refused_as_the_kernel_refuses_it(project: Path) -> None:
    (project / "a.txt").write_text("a")
    target = inspect(f"{project}/a.txt/", str(project))
    assert target.identity is None
    assert target.missing_or_raise()
    with pytest.raises(IsADirectoryError):
        write_bytes(target, b"x")
    assert (project / "a.txt").read_text() == "a"


def test_a_link_loop_fails_as_a_loop(project: Path) -> None:
    (project / "x").symlink_to("y")
    (project / "y").symlink_to("x")
    target = inspect(str(project / "x"), str(project))
    with pytest.raises(OSError, match="symbolic links"):
        target.missing_or_raise()
    with pytest.raises(OSError, match="symbolic links"):
        write_bytes(target, b"x")
