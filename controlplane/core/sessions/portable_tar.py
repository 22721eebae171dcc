"""A session's workspace tar made restorable: what no new session would accept is left out, by name.

A sandbox's own tools can make what a workspace archive may not carry into a new session (workspace_archive.py
refuses it, and the agent's extractor too): symlinks leading out of the workspace (`ln -s /etc/hostname x`, or
through another link: `ln -s . a; ln -s a/a/../.. x`), FIFOs and device nodes. Such an entry means nothing in
another sandbox (it names that sandbox's own files), so a snapshot or a fork drops it instead of letting one link
make the whole workspace unrestorable; the rest is copied byte for byte with its mode, owner-independent. What is
dropped is decided by the same walk that checks a CreateSession archive, so what a snapshot keeps restores.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass

from controlplane.core.sessions.workspace_archive import unrestorable


@dataclass(frozen=True)
class Portable:
    tar: bytes
    dropped: list[str]
    """Each left-out entry, `NAME: why`."""
    entries: int
    """In the source tar."""


def portable(tar: bytes) -> Portable:
    # Headers first, seeking over the file data: almost every workspace has nothing to leave out, and then its
    # tar is used as it came, not copied.
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as headers:
        members = headers.getmembers()
    refused = unrestorable(members)
    if not refused:
        return Portable(tar, [], len(members))
    out = io.BytesIO()
    dropped: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r|") as source, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as copy:
        for index, member in enumerate(source):
            why = refused.get(index)
            if why is not None:
                dropped.append(why)
                continue
            copy.addfile(member, source.extractfile(member) if member.isreg() else None)
    return Portable(out.getvalue(), dropped, len(members))
