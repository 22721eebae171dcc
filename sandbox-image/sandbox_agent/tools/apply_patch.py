"""The `apply_patch` tool: verifies every hunk, asks `edit` once for all files, then writes them.

Platform decisions that differ from OpenCode v1.2.27:
- a pure-addition chunk (no `-`/` ` lines) with an `@@ context` is inserted right after that context line,
  where upstream always appends it at the end of the file (a chunk without context still appends);
- `*** End of File` is honoured: the chunk's old lines must match at the very end of the file (upstream's parser
  stops at every `***` line first, so it never sees the marker and drops the lines that follow it).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from sandbox_agent.errors import AgentError
from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.diffs import count_changes, unified_diff
from sandbox_agent.tools.patch import (
    AddFile,
    DeleteFile,
    Hunk,
    PatchError,
    UpdateFile,
    derive_new_contents,
    is_empty_patch,
    parse_patch,
)
from sandbox_agent.tools.paths import assert_external_directory, checked_target, relative_to_worktree, resolve
from sandbox_agent.tools.safe_open import MakeDirError, Target, open_checked, unlink_checked, write_bytes

VERIFICATION_FAILED = "apply_patch verification failed"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# libuv's texts (uv_strerror), which Node puts in its filesystem errors.
_UV_MESSAGES = {
    "E2BIG": "argument list too long",
    "EACCES": "permission denied",
    "EAGAIN": "resource temporarily unavailable",
    "EBADF": "bad file descriptor",
    "EBUSY": "resource busy or locked",
    "EDQUOT": "disk quota exceeded",
    "EEXIST": "file already exists",
    "EFBIG": "file too large",
    "EINVAL": "invalid argument",
    "EIO": "i/o error",
    "EISDIR": "illegal operation on a directory",
    "ELOOP": "too many symbolic links encountered",
    "EMFILE": "too many open files",
    "ENAMETOOLONG": "name too long",
    "ENFILE": "file table overflow",
    "ENODEV": "no such device",
    "ENOENT": "no such file or directory",
    "ENOMEM": "not enough memory",
    "ENOSPC": "no space left on device",
    "ENOTDIR": "not a directory",
    "ENOTEMPTY": "directory not empty",
    "ENXIO": "no such device or address",
    "EPERM": "operation not permitted",
    "EROFS": "read-only file system",
    "ETXTBSY": "text file is busy",
    "EXDEV": "cross-device link not permitted",
}

ChangeType = Literal["add", "update", "delete", "move"]


class NodeFsError(AgentError):
    """A filesystem failure worded as Node words it; `str(exc)` is Node's `error.message`."""


def node_error_message(exc: OSError, syscall: str, path: str | None = None) -> str:
    """Node's text for a failed fs call, e.g. `ENOENT: no such file or directory, open '/x'`."""
    code = errno.errorcode.get(exc.errno or 0)
    if code is None:
        return f"Unknown system error -{exc.errno}"
    text = _UV_MESSAGES.get(code) or os.strerror(exc.errno or 0).lower()
    return f"{code}: {text}, {syscall}" + (f" '{path}'" if path is not None else "")


@dataclass
class FileChange:
    type: ChangeType
    file_path: str
    before: str
    after: str
    diff: str
    additions: int
    deletions: int
    move_path: str | None = None
    target: Target = field(default_factory=lambda: Target("", "", None, False))
    """The file as checked (safe_open): the asks name its spellings, `_apply` writes exactly it."""
    move_target: Target | None = None


def _read_text(target: Target) -> str:
    """The checked file decoded as UTF-8 (invalid bytes become U+FFFD), failing the way Node's readFile does."""
    path = target.path
    try:
        if target.identity is None:
            target.missing_or_raise()
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        # O_NONBLOCK: a FIFO must not hang the tool; it has no effect on regular files.
        fd = open_checked(target, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise NodeFsError(node_error_message(exc, "open", path)) from exc
    try:
        data = bytearray()
        while True:
            try:
                block = os.read(fd, 1 << 16)
            except OSError as exc:
                # A directory opens fine and fails here, as in Node: `EISDIR: ..., read` without a path.
                raise NodeFsError(node_error_message(exc, "read")) from exc
            if not block:
                break
            data += block
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _read_for_update(target: Target) -> str | None:
    """The current content, or None when there is nothing to update (missing path or a directory)."""
    if target.identity is None or target.is_dir:
        return None
    return _read_text(target)


def _write_text(target: Target, text: str) -> None:
    """Writes the checked file (safe_open: created when it was missing, parents made, no link followed)."""
    # Node writes a lone surrogate as U+FFFD.
    data = _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")
    try:
        write_bytes(target, data, mode=0o666)
    except MakeDirError as failed:
        raise NodeFsError(node_error_message(failed.error, "mkdir", failed.directory)) from None
    except OSError as exc:
        # An open error names the path (as Node's does); a write error does not.
        raise NodeFsError(node_error_message(exc, "open" if exc.filename else "write", target.path)
                          if exc.filename else node_error_message(exc, "write")) from exc


def _unlink(target: Target) -> None:
    try:
        unlink_checked(target)
    except OSError as exc:
        raise NodeFsError(node_error_message(exc, "unlink", target.path)) from exc


def _apply(changes: list[FileChange]) -> None:
    """Writes the verified changes in patch order; a failure leaves the earlier ones applied, as upstream."""
    for change in changes:
        if change.type in ("add", "update"):
            _write_text(change.target, change.after)
        elif change.type == "move" and change.move_target is not None:
            _write_text(change.move_target, change.after)
            # A move onto itself must not delete what was just written (upstream loses the file).
            if change.move_target.real != change.target.real:
                _unlink(change.target)
        elif change.type == "delete":
            _unlink(change.target)


def _diffed(type_: ChangeType, target: Target, before: str, after: str, move: Target | None = None) -> FileChange:
    additions, deletions = count_changes(before, after)
    path = target.path
    return FileChange(type_, path, before, after, unified_diff(path, before, after), additions, deletions,
                      move.path if move else None, target, move)


async def _verify(ctx: ToolContext, hunk: Hunk) -> FileChange:
    file_path = resolve(ctx, hunk.path)
    target = await checked_target(ctx, file_path)
    await assert_external_directory(ctx, file_path, real=target.real)
    if not isinstance(hunk, AddFile):
        # Before the file is read: a verification error would otherwise tell whether a guessed line is there.
        await _assert_readable(ctx, target)
    if isinstance(hunk, AddFile):
        contents = hunk.contents
        after = contents if not contents or contents.endswith("\n") else contents + "\n"
        return _diffed("add", target, "", after)
    if isinstance(hunk, UpdateFile):
        try:
            before = await ctx.io(_read_for_update, target)
        except NodeFsError as exc:
            raise ToolError(str(exc)) from exc
        if before is None:
            raise ToolError(f"{VERIFICATION_FAILED}: Failed to read file to update: {file_path}")
        try:
            after = derive_new_contents(file_path, hunk.chunks, before)
        except PatchError as exc:
            raise ToolError(f"{VERIFICATION_FAILED}: Error: {exc}") from exc
        move_path = resolve(ctx, hunk.move_path) if hunk.move_path else None
        move = await checked_target(ctx, move_path) if move_path else None
        await assert_external_directory(ctx, move_path, real=move.real if move else None)
        return _diffed("move" if move else "update", target, before, after, move)
    assert isinstance(hunk, DeleteFile)
    try:
        before = await ctx.io(_read_text, target)
    except NodeFsError as exc:
        raise ToolError(f"{VERIFICATION_FAILED}: Error: {exc}") from exc
    # Upstream counts the deleted lines this way (a final newline adds one), not with the line diff.
    return FileChange("delete", file_path, before, "", unified_diff(file_path, before, ""), 0,
                      len(before.split("\n")), None, target)


async def _assert_readable(ctx: ToolContext, target: Target) -> None:
    """An update, move or delete shows the file's text (its diff and metadata, and a move's new name): the file's
    `read` rules hold for it too, by every name, as `read` would ask them. Upstream asks `edit` only, so a
    move would hand a read-denied file's text to the model; when the rules allow the read outright nothing
    more is asked (upstream's ask shape). The control plane sends the rules with every call (ToolStart's
    `rules` or `path_rules`); without them (a bare agent in unit tests) nothing is asked, as for grep's filter."""
    rules = ctx.rules
    if rules is None or all(rules.action("read", name) == "allow" for name in target.names):
        return
    await ctx.ask("read", target.shown, ["*"], {}, target.respellings)


def _relative(ctx: ToolContext, path: str) -> str:
    return relative_to_worktree(ctx, path).replace("\\", "/")


def _file_metadata(ctx: ToolContext, change: FileChange) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "filePath": change.file_path,
        "relativePath": _relative(ctx, change.move_path or change.file_path),
        "type": change.type,
        "diff": change.diff,
        "before": change.before,
        "after": change.after,
        "additions": change.additions,
        "deletions": change.deletions,
    }
    if change.move_path:
        entry["movePath"] = change.move_path
    return entry


def _summary_line(ctx: ToolContext, change: FileChange) -> str:
    letter = {"add": "A", "delete": "D"}.get(change.type, "M")
    return f"{letter} {_relative(ctx, change.move_path or change.file_path)}"


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    patch_text = args.get("patchText")
    if not patch_text or not isinstance(patch_text, str):
        raise ToolError("patchText is required")
    try:
        hunks = parse_patch(patch_text)
    except PatchError as exc:
        raise ToolError(f"{VERIFICATION_FAILED}: Error: {exc}") from exc
    if not hunks:
        if is_empty_patch(patch_text):
            raise ToolError("patch rejected: empty patch")
        raise ToolError(f"{VERIFICATION_FAILED}: no hunks found")

    # Every hunk is checked against the files as they are now, before anything is written.
    changes = [await _verify(ctx, hunk) for hunk in hunks]
    total_diff = "".join(change.diff + "\n" for change in changes)
    files = [_file_metadata(ctx, change) for change in changes]
    # The pattern is the source path even for a move; the metadata shows the destination. Where a link leads
    # a path elsewhere (or a file has other hard-link names), those spellings follow the given ones: the
    # source's, then a move destination's real ones (its given one stays unasked, as upstream).
    patterns = [_relative(ctx, change.file_path) for change in changes]
    extra: list[str] = []
    for change in changes:
        for name in (*change.target.spellings, *(change.move_target.spellings if change.move_target else ())):
            spelled = _relative(ctx, name)
            if spelled not in patterns and spelled not in extra:
                extra.append(spelled)
    # A move writes its destination: the destination's rules decide too (upstream asks for the source alone,
    # so `edit: {"precious.txt": "deny"}` let a move replace precious.txt: a red-team finding). It is matched,
    # not shown, so the ask keeps upstream's shape; so are unnormalised spellings' normal forms.
    checks: list[str] = []
    for change in changes:
        unshown = [*change.target.respellings]
        if change.move_target is not None:
            unshown += [change.move_target.path, *change.move_target.respellings]
        for name in unshown:
            spelled = _relative(ctx, name)
            if spelled not in patterns and spelled not in extra and spelled not in checks:
                checks.append(spelled)
    await ctx.ask("edit", patterns + extra, ["*"],
                  {"filepath": ", ".join(patterns), "diff": total_diff, "files": files}, checks)

    try:
        await ctx.io(_apply, changes)
    except NodeFsError as exc:
        raise ToolError(str(exc)) from exc
    output = "Success. Updated the following files:\n" + "\n".join(_summary_line(ctx, c) for c in changes)
    return ToolOutput(title=output, output=output, metadata={"diff": total_diff, "files": files, "diagnostics": {}})
