"""A session's workspace tar made restorable: what no new session would accept is left out, by name.

A sandbox's own tools can make what a workspace archive may not carry into a new session (workspace_archive.py
refuses it, and the agent's extractor too): symlinks leading out of the workspace (`ln -s /etc/hostname x`), FIFOs
and device nodes. Such an entry means nothing in another sandbox (it names that sandbox's own files), so a
snapshot or a fork drops it instead of letting one link make the whole workspace unrestorable; the rest is
copied byte for byte with its mode, owner-independent.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Portable:
    tar: bytes
    dropped: list[str]
    """Each left-out entry with the reason."""
    entries: int
    """In the source tar."""


def portable(tar: bytes) -> Portable:
    # Headers first, seeking over the file data: almost every workspace has nothing to leave out, and then its
    # tar is used as it came, not copied.
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as headers:
        members = headers.getmembers()
        if not any(_unportable(member) for member in members):
            return Portable(tar, [], len(members))
    out = io.BytesIO()
    dropped: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r|") as source, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as copy:
        for member in source:
            why = _unportable(member)
            if why:
                dropped.append(f"{member.name}: {why}")
                continue
            copy.addfile(member, source.extractfile(member) if member.isreg() else None)
    return Portable(out.getvalue(), dropped, len(members))


def _unportable(member: tarfile.TarInfo) -> str:
    if member.issym():
        target = member.linkname
        if not target or target.startswith("/"):
            return f"a symlink to {target!r}, outside the workspace"
        if _escapes(posixpath.dirname(member.name), target):
            return f"a symlink to {target!r}, outside the workspace"
        return ""
    if member.islnk():
        return "" if not _escapes("", member.linkname) and not member.linkname.startswith("/") else "a hard link out"
    if member.isreg() or member.isdir():
        return ""
    return "not a file, directory or link (a FIFO or a device)"


def _escapes(directory: str, target: str) -> bool:
    """Whether `target`, read from `directory`, climbs above the workspace (by its words alone)."""
    depth = 0
    for part in [*directory.split("/"), *target.split("/")]:
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False
