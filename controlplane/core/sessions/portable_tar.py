"""A session's workspace tar made restorable: what no new session would accept is left out, by name.

A sandbox's own tools can make what a workspace archive may not carry into a new session (workspace_archive.py
refuses it, and the agent's extractor too): symlinks leading out of the workspace (`ln -s /etc/hostname x`, or
through another link: `ln -s . a; ln -s a/a/../.. x`), FIFOs and device nodes. Such an entry means nothing in
another sandbox (it names that sandbox's own files), so a snapshot or a fork drops it instead of letting one link
make the whole workspace unrestorable; the rest is copied byte for byte with its mode, owner-independent. What is
dropped is decided by the same walk that checks a CreateSession archive, so what a snapshot keeps restores.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

from controlplane.core.sessions.archive_stream import CappedTarInfo
from controlplane.core.sessions.workspace_archive import unrestorable
from controlplane.errors import ControlPlaneError, ResourceExhaustedError

MAX_ENTRIES = 1 << 20
"""Without a caller's limit (limits.max_archive_entries is the plane's)."""
MAX_LISTED = 100
MAX_SHOWN = 300
"""What is said of the entries left out (logged as one line): the first MAX_LISTED, each cut at MAX_SHOWN
characters, then their count. A tree made of thousands of long names must not make a log line of 100 MB."""


class _StoppedError(ControlPlaneError):
    """A portable pass whose caller is gone: no one sees it (the caller was cancelled)."""


@dataclass(frozen=True)
class Portable:
    tar: bytes
    dropped: list[str]
    """Each left-out entry, `NAME: why`."""
    entries: int
    """In the source tar."""


@dataclass(frozen=True)
class PortableFile:
    path: Path
    """The source file itself when nothing is left out, else the copy."""
    dropped: list[str]
    entries: int


def portable(tar: bytes, max_entries: int = MAX_ENTRIES) -> Portable:
    out = io.BytesIO()
    dropped, entries, copied = _made_portable(io.BytesIO(tar), lambda: out, max_entries)
    return Portable(out.getvalue() if copied else tar, dropped, entries)


def portable_file(source: Path, copy: Path, stop: threading.Event | None = None,
                  max_entries: int = MAX_ENTRIES) -> PortableFile:
    """As `portable`, from a tar file to another (`copy`, made only when something is left out): a workspace is
    read from disk a piece at a time, never held whole in memory (snapshotting.py spools it there). Once `stop` is
    set, the pass ends at its next read (_StoppedError)."""
    with open(source, "rb") as tar, contextlib.ExitStack() as outputs:
        reader = tar if stop is None else cast(BinaryIO, _Stoppable(tar, stop))
        dropped, entries, copied = _made_portable(reader, lambda: outputs.enter_context(open(copy, "wb")),
                                                  max_entries)
    return PortableFile(copy if copied else source, dropped, entries)


def _made_portable(source: BinaryIO, out: Callable[[], BinaryIO], max_entries: int) -> tuple[list[str], int, bool]:
    """(dropped, entries, whether `out()` got a copy): `source` must be seekable. The tar comes from a sandbox's
    agent, which a compromised one writes at will: its headers are read as an upload's (archive_stream.py: a PAX
    or long-name header past 1 MiB is refused before it is read), and past `max_entries` the pass stops (a
    count no new session would take) before the headers held grow further."""
    # Headers first, seeking over the file data: almost every workspace has nothing to leave out, and then its
    # tar is used as it came, not copied.
    members: list[tarfile.TarInfo] = []
    with tarfile.open(fileobj=source, mode="r:", tarinfo=CappedTarInfo) as headers:
        while (member := headers.next()) is not None:
            if len(members) == max_entries:
                raise ResourceExhaustedError(
                    f"the workspace has more than {max_entries} entries; a session can be created from at most "
                    f"{max_entries} (limits.max_archive_entries)")
            members.append(member)
    refused = unrestorable(members)
    if not refused:
        return [], len(members), False
    source.seek(0)
    dropped: list[str] = []
    with tarfile.open(fileobj=source, mode="r|", tarinfo=CappedTarInfo) as stream, \
            tarfile.open(fileobj=out(), mode="w|", format=tarfile.PAX_FORMAT) as copy:
        for index, member in enumerate(stream):
            why = refused.get(index)
            if why is not None:
                if len(dropped) < MAX_LISTED:
                    dropped.append(why if len(why) <= MAX_SHOWN else why[:MAX_SHOWN] + "...")
                continue
            copy.addfile(member, stream.extractfile(member) if member.isreg() else None)
    if len(refused) > MAX_LISTED:
        dropped.append(f"and {len(refused) - MAX_LISTED} more entries")
    return dropped, len(members), True


class _Stoppable:
    """A file read until `stop` is set: a cancelled snapshot's pass over a workspace of hundreds of MiB ends at its
    next piece, so that its caller (which waits for it before it removes the files) is not held for seconds."""

    def __init__(self, inner: BinaryIO, stop: threading.Event) -> None:
        self._inner, self._stop = inner, stop

    def read(self, size: int = -1) -> bytes:
        if self._stop.is_set():
            raise _StoppedError("the portable pass was stopped: its caller is gone")
        return self._inner.read(size)

    def __getattr__(self, name: str) -> object:  # seek, tell, name, mode: the tar reader's other needs
        return getattr(self._inner, name)
