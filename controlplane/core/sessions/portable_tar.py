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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from controlplane.core.sessions.workspace_archive import unrestorable


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


def portable(tar: bytes) -> Portable:
    out = io.BytesIO()
    dropped, entries, copied = _made_portable(io.BytesIO(tar), lambda: out)
    return Portable(out.getvalue() if copied else tar, dropped, entries)


def portable_file(source: Path, copy: Path) -> PortableFile:
    """As `portable`, from a tar file to another (`copy`, made only when something is left out): a workspace is
    read from disk a piece at a time, never held whole in memory (snapshotting.py spools it there)."""
    with open(source, "rb") as tar, contextlib.ExitStack() as outputs:
        dropped, entries, copied = _made_portable(tar, lambda: outputs.enter_context(open(copy, "wb")))
    return PortableFile(copy if copied else source, dropped, entries)


def _made_portable(source: BinaryIO, out: Callable[[], BinaryIO]) -> tuple[list[str], int, bool]:
    """(dropped, entries, whether `out()` got a copy): `source` must be seekable."""
    # Headers first, seeking over the file data: almost every workspace has nothing to leave out, and then its
    # tar is used as it came, not copied.
    with tarfile.open(fileobj=source, mode="r:") as headers:
        members = headers.getmembers()
    refused = unrestorable(members)
    if not refused:
        return [], len(members), False
    source.seek(0)
    dropped: list[str] = []
    with tarfile.open(fileobj=source, mode="r|") as stream, \
            tarfile.open(fileobj=out(), mode="w|", format=tarfile.PAX_FORMAT) as copy:
        for index, member in enumerate(stream):
            why = refused.get(index)
            if why is not None:
                dropped.append(why)
                continue
            copy.addfile(member, stream.extractfile(member) if member.isreg() else None)
    return dropped, len(members), True
