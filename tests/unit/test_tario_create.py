"""The workspace archiver (tario create): every entry it can read, however deep, and a list of what it cannot."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_agent import workspace_archiver
from sandbox_agent.workspace_archiver import create

NOBODY = 65534


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path is root's alone), owned by that user."""
    with tempfile.TemporaryDirectory(prefix="tario-create-") as made:
        os.chmod(made, 0o755)
        src = Path(made) / "src"
        src.mkdir()
        os.chown(src, NOBODY, NOBODY)
        yield src


def archive_as_nobody(src: Path, into: Path) -> tuple[int, list[str], str]:
    """The archiver in a child running as another user, as the tool user runs it (root's reads no mode stops):
    exit code, archived names, what it says it left out."""
    with open(into / "out.tar", "w+b") as out, open(into / "left.txt", "w+") as left:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            status = 1
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                left.write("\n".join(create(str(src), out)))
                left.flush()
                out.flush()
                status = 0
            except BaseException as exc:  # reported through the exit code and the file
                left.write(repr(exc))
                left.flush()
            os._exit(status)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out.seek(0)
        left.seek(0)
        names = tarfile.open(fileobj=out).getnames() if code == 0 else []
        return code, names, left.read()


def as_nobody(path: Path, text: str | None = None) -> Path:
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    os.chown(path, NOBODY, NOBODY)
    return path


def archived_modes(src: Path, into: Path) -> tuple[dict[str, int], dict[str, bytes], str]:
    """As `archive_as_nobody`: each member's mode, each file's content, what was left out."""
    code, _, left = archive_as_nobody(src, into)
    assert code == 0, left
    with tarfile.open(into / "out.tar") as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
        contents = {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar.getmembers() if m.isreg()}
    return modes, contents, left


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the archiver as another user")
def test_the_archivers_own_file_and_directory_of_mode_000_are_archived_whole_with_their_mode(
        shared_dir: Path, tmp_path: Path) -> None:
    as_nobody(shared_dir / "work.txt", "the work\n")
    os.chmod(as_nobody(shared_dir / "secret.txt", "the secret\n"), 0)
    closed = as_nobody(shared_dir / "closed")
    as_nobody(closed / "f", "inside\n")
    os.chmod(closed / "f", 0)
    os.chmod(closed, 0)
    search_only = as_nobody(shared_dir / "search-only")  # read but no search bit: its entries' lookups fail
    as_nobody(search_only / "g", "g\n")
    os.chmod(search_only, 0o400)
    modes, contents, left = archived_modes(shared_dir, tmp_path)
    assert left == ""
    assert modes == {"closed": 0, "closed/f": 0, "search-only": 0o400, "search-only/g": 0o644, "secret.txt": 0,
                     "work.txt": 0o644}
    assert contents == {"closed/f": b"inside\n", "search-only/g": b"g\n", "secret.txt": b"the secret\n",
                        "work.txt": b"the work\n"}
    # The modes are put back once read.
    on_disk = {p: os.lstat(shared_dir / p).st_mode & 0o7777 for p in modes}
    assert on_disk == modes


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the archiver as another user")
def test_another_users_unreadable_file_or_directory_is_left_out_listed_and_unchanged(
        shared_dir: Path, tmp_path: Path) -> None:
    as_nobody(shared_dir / "work.txt", "the work\n")
    secret = shared_dir / "secret.txt"  # root's: the archiving user may not change its mode
    secret.write_text("x")
    os.chmod(secret, 0)
    closed = shared_dir / "closed"
    closed.mkdir()
    (closed / "f").write_text("x")
    os.chmod(closed, 0)
    code, names, left = archive_as_nobody(shared_dir, tmp_path)
    assert code == 0, left
    assert names == ["work.txt"]
    assert left.splitlines() == ["closed/: Permission denied", "secret.txt: Permission denied"]
    assert (os.lstat(secret).st_mode & 0o7777, os.lstat(closed).st_mode & 0o7777) == (0, 0)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the archiver as another user")
def test_a_link_to_an_unreadable_file_of_the_archivers_is_kept_as_a_link_and_changes_nothing(
        shared_dir: Path, tmp_path: Path) -> None:
    target = shared_dir.parent / "target"  # outside SRC, the archiver's own, mode 000
    as_nobody(target, "outside\n")
    os.chmod(target, 0)
    os.symlink(target, shared_dir / "link")
    os.lchown(shared_dir / "link", NOBODY, NOBODY)
    modes, contents, left = archived_modes(shared_dir, tmp_path)
    assert (list(modes), contents, left) == (["link"], {}, "")
    assert os.lstat(target).st_mode & 0o7777 == 0


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the archiver as another user")
def test_the_root_of_mode_000_is_archived_whole_and_its_mode_put_back(shared_dir: Path, tmp_path: Path) -> None:
    # The model's `chmod 000 /workspace`: before, the archiver could not open SRC, and no pause, snapshot or kept
    # copy of the session could be made (its work lost at its end).
    as_nobody(shared_dir / "work.txt", "the work\n")
    as_nobody(shared_dir / "sub")
    as_nobody(shared_dir / "sub" / "g", "g\n")
    os.chmod(shared_dir, 0)
    modes, contents, left = archived_modes(shared_dir, tmp_path)
    assert left == ""
    assert sorted(modes) == ["sub", "sub/g", "work.txt"]
    assert contents == {"work.txt": b"the work\n", "sub/g": b"g\n"}
    assert os.lstat(shared_dir).st_mode & 0o7777 == 0


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the archiver as another user")
def test_another_users_closed_root_is_refused_and_unchanged(shared_dir: Path, tmp_path: Path) -> None:
    os.chown(shared_dir, 0, 0)
    os.chmod(shared_dir, 0)
    code, names, left = archive_as_nobody(shared_dir, tmp_path)
    assert (code, names) == (1, [])
    assert "PermissionError" in left
    assert os.lstat(shared_dir).st_mode & 0o7777 == 0


def test_what_lies_past_the_name_bound_is_left_out_once_and_memory_stays_linear(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A chain made to blow the archive up: every entry's header carries its whole name. Before, the walk also
    # held every level's whole path (memory of N x D^2 / 2: about 400 MB for 2,000 levels of 200 bytes).
    monkeypatch.setattr(workspace_archiver, "MAX_NAME_BYTES", 2000)
    src = tmp_path / "src"
    src.mkdir()
    level = "y" * 99
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(40):  # 40 x 100 bytes: the 20th level's name reaches 2,000 bytes
        os.mkdir(level, dir_fd=fd)
        following = os.open(level, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = following
    os.close(fd)
    (src / "beside.txt").write_text("kept\n")
    out = io.BytesIO()
    left = create(str(src), out)
    assert len(left) == 1
    assert left[0].startswith(level + "/" + level)
    assert left[0].endswith("its name passes 2000 bytes, and all below")
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        names = tar.getnames()
    assert len(names) == 20 + 1
    assert max(len(n) for n in names) == 20 * 100 - 1
    assert "beside.txt" in names


def test_a_chain_deeper_than_path_max_is_archived_to_path_max(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    level = "x" * 200
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(25):  # 25 x 201 characters: past PATH_MAX (4096), made relative to each parent
        os.mkdir(level, dir_fd=fd)
        following = os.open(level, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = following
    with os.fdopen(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as deep:
        deep.write("deep\n")
    os.close(fd)
    (src / "beside.txt").write_text("kept\n")
    out = io.BytesIO()
    left = create(str(src), out)  # walked by descriptors: no ENAMETOOLONG on the way
    assert len(left) == 1
    assert left[0].endswith("its name passes 4096 bytes, and all below")
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        names = tar.getnames()
    # The first 20 levels (4,020 bytes of name), as a restore takes them; the rest is left out once.
    assert sorted(names) == sorted(["beside.txt", *("/".join([level] * n) for n in range(1, 21))])


def test_links_and_hard_links_are_kept_as_links(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    os.link(src / "a.txt", src / "b.txt")
    os.symlink("a.txt", src / "link")
    os.mkfifo(src / "pipe")
    out = io.BytesIO()
    assert create(str(src), out) == []
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        kinds = {m.name: (m.type, m.linkname) for m in tar.getmembers()}
    assert kinds == {"a.txt": (tarfile.REGTYPE, ""), "b.txt": (tarfile.LNKTYPE, "a.txt"),
                     "link": (tarfile.SYMTYPE, "a.txt"), "pipe": (tarfile.FIFOTYPE, "")}
