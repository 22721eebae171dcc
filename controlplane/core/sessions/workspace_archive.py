"""Checks a CreateSession workspace archive from its tar headers alone, before any sandbox exists.

The sandbox agent's extractor refuses the same things entry by entry (defence in depth); checking here
first turns a hostile archive into one clear error instead of a session with entries silently skipped.
"""

from __future__ import annotations

import builtins
import tarfile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from controlplane.core.sessions import archive_stream
from controlplane.errors import ControlPlaneError, InvalidArgumentError, ResourceExhaustedError

PREFIX = "workspace upload refused: "
MAX_SYMLINK_HOPS = 40
"""Linux's own limit: a longer chain fails with ELOOP there, so it can lead nowhere."""
MAX_NAME_BYTES = 4096
"""PATH_MAX: a longer name could not be created anyway."""
WALK_STEPS = 100_000
WALK_STEPS_PER_ENTRY = 64
"""The budget of path components walked (links followed) is WALK_STEPS plus this per entry, unused steps
carrying over: real trees use a handful per entry, and deep link chains cannot make the check slow."""
SHOWN_CHARS = 120
MAX_LEAVE_OUT_ROUNDS = 8
"""unrestorable(): a real workspace needs two (what leads out, then a check that the rest holds); past this, every
link is left out."""

_SPECIAL_KINDS = {
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}


@dataclass(frozen=True)
class ArchiveStats:
    entries: int
    bytes: int
    """Declared size of its regular files."""
    kept: dict[str, builtins.bytes] = field(default_factory=dict)
    """The regular files `check` was asked to keep, by workspace path (each cut at `keep_bytes` + 1)."""


class _Node:
    """One path of the workspace as the archive would leave it (links are kept as their target text)."""

    __slots__ = ("children", "file", "link", "parent")

    def __init__(self, parent: _Node | None) -> None:
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.link: str | None = None
        self.file = False

    def child(self, name: str) -> _Node:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = _Node(self)
        return node


class _EscapedError(ControlPlaneError):
    pass


class _TooComplexError(ControlPlaneError):
    pass


class _Tree:
    def __init__(self) -> None:
        self.root = _Node(None)
        self.links: list[tuple[str, _Node]] = []
        self._steps = 0

    def grant(self, steps: int) -> None:
        self._steps += steps

    def resolve(self, start: _Node, path: str) -> _Node:
        """Where `path` (relative to `start`) leads, following links; _EscapedError when it climbs above the root."""
        node = start
        pending = deque(path.split("/"))
        hops = 0
        while pending:
            self._steps -= 1
            if self._steps < 0:
                raise _TooComplexError
            part = pending.popleft()
            if part in ("", "."):
                continue
            if part == "..":
                if node.parent is None:
                    raise _EscapedError
                node = node.parent
                continue
            child = node.child(part)
            if child.link is None:
                node = child
                continue
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                return node  # the kernel gives up on such a chain (ELOOP): it reaches nothing
            if child.link.startswith("/"):
                raise _EscapedError
            pending.extendleft(reversed(child.link.split("/")))
        return node


def check(archive: bytes, max_entries: int, max_bytes: int, keep: Callable[[str], bool] | None = None,
          keep_bytes: int = 1 << 20, keep_total: int = 8 << 20) -> ArchiveStats:
    """Raises InvalidArgumentError naming the first entry that would escape or is not allowed, and
    ResourceExhaustedError past `max_entries` entries or `max_bytes` of declared file data.

    The regular files whose workspace path `keep` accepts are read on the way, as extraction would
    leave them (a later entry of the same path replaces or removes them); reached through a link, they
    are not. Each is cut at `keep_bytes` + 1; past `keep_total` bytes kept, ResourceExhaustedError."""
    entries = total = kept_bytes = 0
    kept: dict[str, bytes] = {}
    tree = _Tree()
    tree.grant(WALK_STEPS)
    try:
        stream = archive_stream.decompressed(archive)
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=archive_stream.CappedTarInfo) as tar:
            # Iterating reads the next header only after this body ran, so sizes are checked before a
            # declared (maybe huge, maybe absent) payload is skipped or decompressed.
            for member in tar:
                entries += 1
                if entries > max_entries:
                    raise ResourceExhaustedError(
                        f"{PREFIX}the archive has more than {max_entries} entries (limits.max_archive_entries)"
                    )
                if member.isreg():
                    if total + member.size > max_bytes:
                        raise ResourceExhaustedError(f"{PREFIX}archive expands past the {max_bytes}-byte limit")
                    total += member.size
                tree.grant(WALK_STEPS_PER_ENTRY)
                _check_member(tree, member)
                if keep is not None:
                    kept_bytes += _keep(tar, member, keep, keep_bytes, kept)
                    if kept_bytes > keep_total:
                        raise ResourceExhaustedError(
                            f"{PREFIX}its project config files come to more than {keep_total} bytes"
                        )
    except tarfile.TarError as exc:
        raise InvalidArgumentError(f"{PREFIX}not a valid tar archive: {exc}") from exc
    except ControlPlaneError:
        raise
    except archive_stream.STREAM_ERRORS as exc:  # a corrupt compressed stream
        kind = archive_stream.compression(archive) or "tar"
        raise InvalidArgumentError(f"{PREFIX}not a valid {kind} stream: {exc}") from exc
    # A later entry can change where an earlier link leads (a link to "a/.." before "a" became a link to ".").
    for name, node in tree.links:
        if node.link is not None:  # not replaced by a later entry
            tree.grant(WALK_STEPS_PER_ENTRY)
            _check_link_target(tree, name, node.parent or tree.root, node.link)
    return ArchiveStats(entries, total, kept)


def unrestorable(members: Sequence[tarfile.TarInfo]) -> dict[int, str]:
    """The entries of a workspace tar that `check` would refuse, by index, each as `NAME: why`: what a snapshot
    leaves out so that the rest restores. Judged by `check`'s own walk, so links are followed through the links
    the tar itself makes (`a -> .` then `x -> a/a/../..` leads out, though its words alone never climb above where
    they start)."""
    refused: dict[int, str] = {}
    for _ in range(MAX_LEAVE_OUT_ROUNDS):
        # Leaving an entry out can change what others mean (a hard link to `a/f` names nothing once the link `a`
        # is gone), so the rest is judged again as `check` will judge the copy, until nothing more is refused.
        found = _refused(members, refused)
        if not found:
            return refused
        refused.update(found)
    # Made to keep failing (a hostile agent's tar): every link goes, so nothing is reached through one and the
    # files and directories left restore as they are.
    for index, member in enumerate(members):
        if index not in refused and (member.issym() or member.islnk()):
            refused[index] = f"{member.name}: a link among links too tangled to check (all links are left out)"
    return refused


def _refused(members: Sequence[tarfile.TarInfo], skipped: dict[int, str]) -> dict[int, str]:
    """`check`'s walk over the entries not `skipped`: the ones it would refuse."""
    tree = _Tree()
    tree.grant(WALK_STEPS)
    found: dict[int, str] = {}
    links: list[tuple[int, _Node, str]] = []
    for index, member in enumerate(members):
        if index in skipped:
            continue
        tree.grant(WALK_STEPS_PER_ENTRY)
        try:
            node = _check_member(tree, member)
        except InvalidArgumentError as exc:
            found[index] = _reason(exc, member.name)
            continue
        if node is not None and member.issym():
            links.append((index, node, member.linkname))
    for index, node, target in links:
        if node.link != target:
            continue  # replaced by a later entry of that name
        tree.grant(WALK_STEPS_PER_ENTRY)
        try:
            _check_link_target(tree, members[index].name, node.parent or tree.root, target)
        except InvalidArgumentError as exc:
            found[index] = _reason(exc, members[index].name)
    return found


def _reason(refusal: InvalidArgumentError, name: str) -> str:
    """`NAME: why`, from a refusal of `_refuse`'s making."""
    return f"{name}: " + str(refusal).removeprefix(f'{PREFIX}entry "{_shown(name)}" ')


def _keep(tar: tarfile.TarFile, member: tarfile.TarInfo, keep: Callable[[str], bool], limit: int,
          kept: dict[str, bytes]) -> int:
    """Reads `member` into `kept` if it is wanted; the change in bytes kept."""
    path = "/".join(_parts(member.name))
    if not keep(path):
        return 0
    before = len(kept.pop(path, b""))
    body = tar.extractfile(member) if member.isreg() else None
    if body is not None:
        kept[path] = body.read(limit + 1)
    return len(kept.get(path, b"")) - before


def _parts(name: str) -> list[str]:
    """An entry's path components as extraction walks them (`./`, `//` and a trailing `/` say nothing)."""
    return [p for p in name.split("/") if p not in ("", ".")]


def _refuse(name: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f'{PREFIX}entry "{_shown(name)}" {why}')


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _check_member(tree: _Tree, member: tarfile.TarInfo) -> _Node | None:
    """The entry's node once checked (None for the workspace itself)."""
    name = member.name
    if len(name.encode(errors="surrogateescape")) > MAX_NAME_BYTES:
        raise _refuse(name, f"has a name longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/"):
        raise _refuse(name, "has an absolute path")
    parts = _parts(name)
    if ".." in parts:
        depth = 0
        for part in parts:
            depth += -1 if part == ".." else 1
            if depth < 0:
                raise _refuse(name, "escapes the workspace")
        raise _refuse(name, 'has a ".." component')
    if member.type in _SPECIAL_KINDS:
        raise _refuse(name, f"is {_SPECIAL_KINDS[member.type]}; only files, directories and links are allowed")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _refuse(name, f"has the unsupported type {member.type!r}")
    if not parts:
        return None  # the workspace itself ("./")
    try:
        parent = tree.resolve(tree.root, "/".join(parts[:-1]))
    except _EscapedError:
        raise _refuse(name, "lies behind a symlink that leads outside the workspace") from None
    except _TooComplexError:
        raise _refuse(name, "lies behind symlinks too deep to check") from None
    node = parent.child(parts[-1])
    if member.issym():
        if not member.linkname:
            raise _refuse(name, "is a symlink without a target")
        previous = node.link, node.file
        node.link, node.file = member.linkname, False
        try:
            _check_link_target(tree, name, parent, member.linkname)
        except InvalidArgumentError:
            node.link, node.file = previous  # unrestorable() goes on with the tree as if the entry were absent
            raise
        tree.links.append((name, node))
    elif member.islnk():
        _check_hard_link(tree, name, member.linkname)
        node.link, node.file = None, True
    else:
        node.link, node.file = None, member.isreg()
    return node


def _check_link_target(tree: _Tree, name: str, directory: _Node, target: str) -> None:
    if target.startswith("/"):
        raise _refuse(name, f'is a symlink to "{_shown(target)}", an absolute path outside the workspace')
    try:
        tree.resolve(directory, target)
    except _EscapedError:
        raise _refuse(name, f'is a symlink to "{_shown(target)}", outside the workspace') from None
    except _TooComplexError:
        raise _refuse(name, f'is a symlink to "{_shown(target)}", through links too deep to check') from None


def _check_hard_link(tree: _Tree, name: str, target: str) -> None:
    parts = [p for p in target.split("/") if p not in ("", ".")]
    if target.startswith("/") or ".." in parts or not parts:
        raise _refuse(name, f'is a hard link to "{_shown(target)}", outside the workspace')
    try:
        source = tree.resolve(tree.root, "/".join(parts))
    except _EscapedError:
        raise _refuse(name, f'is a hard link to "{_shown(target)}", outside the workspace') from None
    except _TooComplexError:
        raise _refuse(name, f'is a hard link to "{_shown(target)}", through links too deep to check') from None
    if not source.file:
        raise _refuse(name, f'is a hard link to "{_shown(target)}", which is not a file earlier in the archive')
