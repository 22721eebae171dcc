"""Workspace extraction refuses every escape and keeps what is legitimate."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from sandbox_agent.tario import ArchiveTooLargeError, DestinationError, extract
from sandbox_agent.workspace_archiver import create


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


def test_a_cut_archive_leaves_the_file_it_was_replacing(tmp_path: Path) -> None:
    (tmp_path / "only.txt").write_text("old")
    whole = archive(file("only.txt", b"N" * 100_000)).getvalue()
    with pytest.raises(tarfile.ReadError):
        extract(io.BytesIO(whole[:50_000]), str(tmp_path), 1 << 20)
    assert (tmp_path / "only.txt").read_text() == "old"
    assert os.listdir(tmp_path) == ["only.txt"]  # no temporary file left beside it


def test_a_destination_that_is_a_link_is_refused(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "q").symlink_to(outside)
    with pytest.raises(DestinationError):
        extract(archive(file("a.txt")), str(ws / "q"), 1 << 20, str(ws))
    assert list(outside.iterdir()) == []


def test_links_inside_and_replacements_are_kept(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "old").write_text("old")
    summary = extract(
        archive(file("d/a.txt", b"alpha"), entry("d/hard", tarfile.LNKTYPE, "d/a.txt"),
                entry("old", tarfile.SYMTYPE, "d/a.txt"), file("d", b"a file over a directory")),
        str(tmp_path), 1 << 20, str(tmp_path),
    )
    assert (tmp_path / "d/hard").read_bytes() == b"alpha"
    assert os.stat(tmp_path / "d/hard").st_ino == os.stat(tmp_path / "d/a.txt").st_ino
    assert os.readlink(tmp_path / "old") == "d/a.txt"
    assert (tmp_path / "d").is_dir()
    assert [s.split(":")[0] for s in summary.skipped] == ["d"]
    assert sorted(os.listdir(tmp_path)) == ["d", "old"]


def test_create_round_trips(tmp_path: Path) -> None:
    (tmp_path / "src/d").mkdir(parents=True)
    (tmp_path / "src/d/f.txt").write_text("f")
    out = io.BytesIO()
    create(str(tmp_path / "src"), out)
    out.seek(0)
    assert tarfile.open(fileobj=out).getnames() == ["d", "d/f.txt"]


class _Zeros:
    """A file of `size` zero bytes with a few bytes of data at given offsets, made on the fly (no 300 MiB buffer)."""

    def __init__(self, size: int, data: dict[int, bytes]) -> None:
        self.size, self.data, self.pos = size, data, 0

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n < 0 else min(n, self.size - self.pos)
        chunk = bytearray(n)
        for offset, value in self.data.items():
            for i, byte in enumerate(value):
                if self.pos <= offset + i < self.pos + n:
                    chunk[offset + i - self.pos] = byte
        self.pos += n
        return bytes(chunk)


def test_runs_of_zeros_are_extracted_as_holes(tmp_path: Path) -> None:
    # A snapshot of a sparse file (`truncate -s 300M` in a 256 MiB session) must fit back on the same disk.
    size = 300 * 1024 * 1024 + 7  # not a whole number of pages: the tail is data, set by the last write
    data = {100 * 1024 * 1024 + 10: b"middle", 4096 * 3 - 2: b"across", size - 3: b"end"}
    info = tarfile.TarInfo("big.img")
    info.size, info.mode = size, 0o640
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.addfile(info, _Zeros(size, data))
        tail = tarfile.TarInfo("zeros-at-end")
        tail.size = 4 + 3 * 4096
        tar.addfile(tail, io.BytesIO(b"head" + bytes(3 * 4096)))
    buf.seek(0)
    summary = extract(buf, str(tmp_path), 1 << 30)
    assert summary.files == 2
    st = os.stat(tmp_path / "big.img")
    assert st.st_size == size
    assert st.st_blocks * 512 < 1024 * 1024  # its data pages only, not 300 MiB
    assert st.st_mode & 0o777 == 0o640
    with open(tmp_path / "big.img", "rb") as f:
        for offset, value in data.items():
            f.seek(offset - 4096)
            after = min(4096, size - offset - len(value))
            assert f.read(4096 + len(value) + 4096) == bytes(4096) + value + bytes(after)
    assert (tmp_path / "zeros-at-end").read_bytes() == b"head" + bytes(3 * 4096)
    assert sorted(os.listdir(tmp_path)) == ["big.img", "zeros-at-end"]


def _extracted_with_modes(tmp_path: Path, entries: list[tuple[str, int, bytes | None]]) -> Path:
    """An archive of directories (content None) and files with the given modes, extracted into a new directory."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for name, mode, content in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    data.seek(0)
    dest = tmp_path / "dest"
    dest.mkdir()
    summary = extract(data, str(dest), 1 << 20)
    assert summary.skipped == []
    return dest


def test_modes_that_shut_out_the_owner_are_extracted_as_archived(tmp_path: Path) -> None:
    """A copy of a workspace whose model ran chmod 000 comes back with its 000 entries, not widened to 600/700."""
    dest = _extracted_with_modes(tmp_path, [
        ("closed", 0, None), ("closed/inner", 0o500, None), ("closed/inner/f", 0, b"f"), ("secret.txt", 0, b"s"),
        ("plain.txt", 0o644, b"p"), ("open", 0o755, None)])
    modes = {p: os.lstat(dest / p).st_mode & 0o7777
             for p in ["closed", "closed/inner", "closed/inner/f", "secret.txt", "plain.txt", "open"]}
    assert modes == {"closed": 0, "closed/inner": 0o500, "closed/inner/f": 0, "secret.txt": 0, "plain.txt": 0o644,
                     "open": 0o755}
    assert ((dest / "closed/inner/f").read_bytes(), (dest / "secret.txt").read_bytes()) == (b"f", b"s")


def test_set_id_and_sticky_bits_are_extracted_as_archived(tmp_path: Path) -> None:
    """A snapshot's modes whole: 6755, 3777 and 2750 came back as 755, 777 and 750 (a red team's finding)."""
    dest = _extracted_with_modes(tmp_path, [
        ("shared", 0o3777, None), ("group", 0o2750, None), ("group/tool", 0o6755, b"t"),
        ("sticky-closed", 0o1000, None)])
    modes = {p: os.lstat(dest / p).st_mode & 0o7777 for p in ["shared", "group", "group/tool", "sticky-closed"]}
    assert modes == {"shared": 0o3777, "group": 0o2750, "group/tool": 0o6755, "sticky-closed": 0o1000}
    assert (dest / "group/tool").read_bytes() == b"t"
