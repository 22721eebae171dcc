"""Workspace extraction refuses every escape and keeps what is legitimate."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandbox_agent.tario import ArchiveTooLargeError, create, extract


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def entry(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


def test_escapes_are_refused(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    summary = extract(
        archive(
            file("ok/nested/a.txt", b"alpha"),
            file("/abs.txt"),
            file("../up.txt"),
            entry("link", tarfile.SYMTYPE, str(outside)),
            file("link/through.txt"),
            entry("hard", tarfile.LNKTYPE, "../../etc/passwd"),
            entry("dev", tarfile.CHRTYPE),
            entry("fifo", tarfile.FIFOTYPE),
        ),
        str(ws),
        1 << 20,
    )
    assert (ws / "ok/nested/a.txt").read_bytes() == b"alpha"
    assert os.readlink(ws / "link") == str(outside)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "up.txt").exists()
    assert not (ws / "dev").exists()
    assert not (ws / "fifo").exists()
    assert len(summary.skipped) == 6
    assert summary.files == 1
    assert summary.symlinks == 1


def test_existing_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    ws, target = tmp_path / "ws", tmp_path / "target.txt"
    ws.mkdir()
    target.write_text("keep")
    (ws / "name.txt").symlink_to(target)
    extract(archive(file("name.txt", b"new")), str(ws), 1 << 20)
    assert target.read_text() == "keep"
    assert (ws / "name.txt").read_bytes() == b"new"
    assert not (ws / "name.txt").is_symlink()


def test_size_bomb_is_stopped(tmp_path: Path) -> None:
    with pytest.raises(ArchiveTooLargeError):
        extract(archive(file("big", b"x" * 1000)), str(tmp_path), 999)


def test_create_round_trips(tmp_path: Path) -> None:
    (tmp_path / "src/d").mkdir(parents=True)
    (tmp_path / "src/d/f.txt").write_text("f")
    out = io.BytesIO()
    create(str(tmp_path / "src"), out)
    out.seek(0)
    assert tarfile.open(fileobj=out).getnames() == ["d", "d/f.txt"]
