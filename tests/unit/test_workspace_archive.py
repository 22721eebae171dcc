"""The control plane's check of CreateSession workspace archives, from real tar bytes (no sandbox)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from controlplane.core.sessions.workspace_archive import WALK_STEPS, ArchiveStats, check
from controlplane.errors import InvalidArgumentError, ResourceExhaustedError

GIB = 1 << 30


def entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x\n", link: str = "") -> tuple[tarfile.TarInfo,
                                                                                                    bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def tar(*entries: tuple[tarfile.TarInfo, bytes | None], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def refused(archive: bytes, max_entries: int = 1000, max_bytes: int = GIB) -> str:
    with pytest.raises(InvalidArgumentError) as caught:
        check(archive, max_entries, max_bytes)
    return str(caught.value)


def test_an_ordinary_project_passes_with_its_counts(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text("print(1)\n")
    (tmp_path / "README.md").write_text("# hi\n")
    (tmp_path / "src" / "current").symlink_to("pkg")
    (tmp_path / "src" / "pkg" / "readme").symlink_to("../../README.md")
    os.link(tmp_path / "README.md", tmp_path / "README.copy")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as archive:  # like `tar czf - .`
        archive.add(tmp_path, arcname=".")
    stats = check(buf.getvalue(), 1000, GIB)
    # ".", src, src/pkg, a.py, README.md, README.copy (a hard link), current, readme
    assert stats == ArchiveStats(entries=8, bytes=len("print(1)\n") + len("# hi\n"))


def test_links_inside_the_workspace_are_allowed() -> None:
    archive = tar(
        entry("sub", tarfile.DIRTYPE), entry("sub/file.txt"),
        entry("in", tarfile.SYMTYPE, link="sub"),
        entry("in/through.txt"),  # written through a link that stays inside: lands in sub/
        entry("sub/up", tarfile.SYMTYPE, link=".."),  # the workspace itself
        entry("dangling", tarfile.SYMTYPE, link="not/yet/there"),
        entry("loop1", tarfile.SYMTYPE, link="loop2"), entry("loop2", tarfile.SYMTYPE, link="loop1"),
        entry("hard", tarfile.LNKTYPE, link="in/through.txt"),
        entry("./dotted/./name.txt"),
    )
    assert check(archive, 1000, GIB) == ArchiveStats(entries=10, bytes=6)


@pytest.mark.parametrize(("entries", "message"), [
    ([entry("ok.txt"), entry("../x")], 'entry "../x" escapes the workspace'),
    ([entry("a/../../etc/passwd")], 'entry "a/../../etc/passwd" escapes the workspace'),
    ([entry("a/../b")], 'entry "a/../b" has a ".." component'),
    ([entry("/tmp/absolute.txt")], 'entry "/tmp/absolute.txt" has an absolute path'),
    ([entry("null", tarfile.CHRTYPE)],
     'entry "null" is a character device; only files, directories and links are allowed'),
    ([entry("disk", tarfile.BLKTYPE)], 'entry "disk" is a block device; only files, directories and links are allowed'),
    ([entry("d", tarfile.DIRTYPE), entry("d/fifo", tarfile.FIFOTYPE)],
     'entry "d/fifo" is a FIFO; only files, directories and links are allowed'),
    ([entry("out", tarfile.SYMTYPE, link="/etc"), entry("out/pwned")],
     'entry "out" is a symlink to "/etc", an absolute path outside the workspace'),
    ([entry("a/b", tarfile.SYMTYPE, link="../../secret")], 'entry "a/b" is a symlink to "../../secret", outside the '
                                                          "workspace"),
    ([entry("empty", tarfile.SYMTYPE, link="")], 'entry "empty" is a symlink without a target'),
    # Each link stays inside on its own; followed together they climb out.
    ([entry("sub/up", tarfile.SYMTYPE, link=".."), entry("esc", tarfile.SYMTYPE, link="sub/up/..")],
     'entry "esc" is a symlink to "sub/up/..", outside the workspace'),
    ([entry("hl", tarfile.LNKTYPE, link="../../../etc/shadow")],
     'entry "hl" is a hard link to "../../../etc/shadow", outside the workspace'),
    ([entry("hl", tarfile.LNKTYPE, link="/etc/shadow")], 'entry "hl" is a hard link to "/etc/shadow", outside the '
                                                         "workspace"),
    ([entry("hl", tarfile.LNKTYPE, link="later.txt"), entry("later.txt")],
     'entry "hl" is a hard link to "later.txt", which is not a file earlier in the archive'),
    ([entry("d", tarfile.DIRTYPE), entry("hl", tarfile.LNKTYPE, link="d")],
     'entry "hl" is a hard link to "d", which is not a file earlier in the archive'),
    ([entry("sub/up", tarfile.SYMTYPE, link=".."), entry("hl", tarfile.LNKTYPE, link="sub/up/x")],
     'entry "hl" is a hard link to "sub/up/x", which is not a file earlier in the archive'),
])
def test_the_first_offending_entry_is_named_with_the_reason(
    entries: list[tuple[tarfile.TarInfo, bytes | None]], message: str,
) -> None:
    assert refused(tar(*entries)) == "workspace upload refused: " + message


def test_a_link_made_to_escape_by_a_later_entry_is_refused() -> None:
    # "s" -> "a/.." is the workspace while "a" does not exist; once "a" links to ".", "s" is its parent.
    redefined = tar(entry("s", tarfile.SYMTYPE, link="a/.."), entry("a", tarfile.SYMTYPE, link="."))
    assert refused(redefined) == 'workspace upload refused: entry "s" is a symlink to "a/..", outside the workspace'
    written_through = tar(entry("s", tarfile.SYMTYPE, link="a/.."), entry("a", tarfile.SYMTYPE, link="."),
                          entry("s/x.txt"))
    assert refused(written_through) == (
        'workspace upload refused: entry "s/x.txt" lies behind a symlink that leads outside the workspace'
    )
    # A link replaced by a plain file later is no link any more.
    replaced = tar(entry("s", tarfile.SYMTYPE, link="a/.."), entry("s"), entry("a", tarfile.SYMTYPE, link="."))
    assert check(replaced, 10, GIB) == ArchiveStats(3, 2)


def test_hostile_entries_are_found_in_compressed_and_gnu_archives() -> None:
    gnu = tar(entry("x" * 150 + "/../../y"), fmt=tarfile.GNU_FORMAT)  # a long name: GNU's ././@LongLink
    assert refused(gnu) == f'workspace upload refused: entry "{("x" * 150)[:120]}..." escapes the workspace'
    assert refused(gzip.compress(tar(entry("ok"), entry("/abs")))) == (
        'workspace upload refused: entry "/abs" has an absolute path'
    )


def test_not_a_tar_archive() -> None:
    assert refused(b"hello world") == "workspace upload refused: not a valid tar archive: truncated header"
    truncated = tar(entry("a.txt", data=b"y" * 5000))[:1024]
    assert refused(truncated) == "workspace upload refused: not a valid tar archive: unexpected end of data"


def test_entry_count_limit() -> None:
    files = [entry(f"d/{i}", data=b"") for i in range(30)]
    assert check(tar(*files), 30, GIB).entries == 30
    with pytest.raises(ResourceExhaustedError) as caught:
        check(tar(*files), 29, GIB)
    assert str(caught.value) == (
        "workspace upload refused: the archive has more than 29 entries (limits.max_archive_entries)"
    )


def test_declared_sizes_are_limited_before_any_payload_is_read() -> None:
    assert check(tar(entry("a", data=b"1234"), entry("b", data=b"5678")), 10, 8).bytes == 8
    with pytest.raises(ResourceExhaustedError) as caught:
        check(tar(entry("a", data=b"1234"), entry("b", data=b"56789")), 10, 8)
    assert str(caught.value) == "workspace upload refused: archive expands past the 8-byte limit"
    bomb = tarfile.TarInfo("big")
    bomb.size = 1 << 34  # 16 GiB declared, nothing sent
    with pytest.raises(ResourceExhaustedError) as caught:
        check(bomb.tobuf(tarfile.GNU_FORMAT) + b"\0" * 4096, 10, GIB)
    assert str(caught.value) == "workspace upload refused: archive expands past the 1073741824-byte limit"


def test_link_chains_cannot_make_the_check_slow() -> None:
    deep = "d/" * 2000  # 4000 bytes: a legal target, 2000 components to walk at each check
    links = [entry(f"l{i}", tarfile.SYMTYPE, link=deep) for i in range(WALK_STEPS // 2000)]
    started = time.monotonic()
    message = refused(tar(*links))
    assert time.monotonic() - started < 2.0
    assert message.startswith('workspace upload refused: entry "l')
    assert message.endswith(f'is a symlink to "{deep[:120]}...", through links too deep to check')
    # A deep but ordinary tree is fine.
    path = "/".join(f"level{i}" for i in range(200))
    assert check(tar(entry(f"{path}/leaf.txt")), 10, GIB).entries == 1
