"""A local directory archived for CreateSession: links kept as links (never followed out of it), special files
skipped, and a size bound that fails before anything is sent."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from controlplane.client import workspace_bytes
from controlplane.errors import InvalidArgumentError
from controlplane.workspace_dir import WorkspaceTooLargeError, archive_directory


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_links_are_stored_not_followed_and_fifos_skipped(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    os.symlink("src/main.py", root / "inside")
    os.symlink(root / "src", root / "src-abs")
    os.symlink("../src/main.py", root / "src" / "up-and-back")
    os.mkfifo(root / "pipe")
    found = members(archive_directory(root))
    assert set(found) == {"src", "src/main.py", "src/up-and-back", "inside", "src-abs"}
    assert found["inside"].issym()
    assert found["inside"].linkname == "src/main.py"
    assert found["src-abs"].linkname == "src"  # absolute into the directory: stored relative
    assert found["src/up-and-back"].linkname == "../src/main.py"


@pytest.mark.parametrize("target", ["{outside}/id_rsa", "{outside}", "../outside/id_rsa", "/etc/passwd"])
def test_a_link_out_of_the_directory_is_refused_by_name(tmp_path: Path, target: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "id_rsa").write_text("PRIVATE KEY")
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.txt").write_text("a")
    os.symlink(target.format(outside=outside), root / "key")
    with pytest.raises(InvalidArgumentError, match="workspace link key points out of"):
        archive_directory(root)


def test_a_directory_over_the_bound_fails_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"\0" * 2048)
    (tmp_path / "small.txt").write_text("x")
    with pytest.raises(WorkspaceTooLargeError, match="create the session empty and upload files"):
        archive_directory(tmp_path, max_bytes=1024)
    with pytest.raises(WorkspaceTooLargeError, match="more than 1 entries"):
        archive_directory(tmp_path, max_entries=1)
    assert set(members(archive_directory(tmp_path, max_bytes=4096))) == {"big.bin", "small.txt"}


def test_workspace_takes_a_directory_a_tar_file_or_bytes(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    tar = tmp_path / "w.tar"
    tar.write_bytes(archive_directory(tmp_path / "d"))
    assert set(members(workspace_bytes(tmp_path / "d", b"", 1 << 20))) == {"a.txt"}
    assert workspace_bytes(tar, b"", 1 << 20) == tar.read_bytes()
    assert workspace_bytes(b"raw", b"", 1 << 20) == b"raw"
    assert workspace_bytes(None, b"old", 1 << 20) == b"old"
    with pytest.raises(InvalidArgumentError, match="not both"):
        workspace_bytes(b"raw", b"old", 1 << 20)
    with pytest.raises(InvalidArgumentError, match="no such directory"):
        workspace_bytes(tmp_path / "missing", b"", 1 << 20)
