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
import stat
from dataclasses import dataclass
from typing import Any, Literal

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
from sandbox_agent.tools.paths import assert_external_directory, relative_to_worktree, resolve

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


class NodeFsError(Exception):
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


def _read_text(path: str) -> str:
    """The file decoded as UTF-8 (invalid bytes become U+FFFD), failing the way Node's readFile does."""
    try:
        # O_NONBLOCK: a FIFO must not hang the tool; it has no effect on regular files.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
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


def _read_for_update(path: str) -> str | None:
    """The current content, or None when there is nothing to update (missing path or a directory)."""
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    return _read_text(path)


def _make_dirs(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise NodeFsError(node_error_message(exc, "mkdir", path)) from exc


def _write_text(path: str, text: str) -> None:
    # Node writes a lone surrogate as U+FFFD.
    data = _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise NodeFsError(node_error_message(exc, "open", path)) from exc
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise NodeFsError(node_error_message(exc, "write")) from exc
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as exc:
        raise NodeFsError(node_error_message(exc, "unlink", path)) from exc


def _apply(changes: list[FileChange]) -> None:
    """Writes the verified changes in patch order; a failure leaves the earlier ones applied, as upstream."""
    for change in changes:
        if change.type == "add":
            _make_dirs(os.path.dirname(change.file_path))
            _write_text(change.file_path, change.after)
        elif change.type == "update":
            _write_text(change.file_path, change.after)
        elif change.type == "move" and change.move_path:
            _make_dirs(os.path.dirname(change.move_path))
            _write_text(change.move_path, change.after)
            # A move onto itself must not delete what was just written (upstream loses the file).
            if os.path.realpath(change.move_path) != os.path.realpath(change.file_path):
                _unlink(change.file_path)
        elif change.type == "delete":
            _unlink(change.file_path)


def _diffed(type_: ChangeType, path: str, before: str, after: str, move_path: str | None = None) -> FileChange:
    additions, deletions = count_changes(before, after)
    return FileChange(type_, path, before, after, unified_diff(path, before, after), additions, deletions, move_path)


async def _verify(ctx: ToolContext, hunk: Hunk) -> FileChange:
    file_path = resolve(ctx, hunk.path)
    await assert_external_directory(ctx, file_path)
    if isinstance(hunk, AddFile):
        contents = hunk.contents
        after = contents if not contents or contents.endswith("\n") else contents + "\n"
        return _diffed("add", file_path, "", after)
    if isinstance(hunk, UpdateFile):
        try:
            before = await ctx.io(_read_for_update, file_path)
        except NodeFsError as exc:
            raise ToolError(str(exc)) from exc
        if before is None:
            raise ToolError(f"{VERIFICATION_FAILED}: Failed to read file to update: {file_path}")
        try:
            after = derive_new_contents(file_path, hunk.chunks, before)
        except PatchError as exc:
            raise ToolError(f"{VERIFICATION_FAILED}: Error: {exc}") from exc
        move_path = resolve(ctx, hunk.move_path) if hunk.move_path else None
        await assert_external_directory(ctx, move_path)
        return _diffed("move" if move_path else "update", file_path, before, after, move_path)
    assert isinstance(hunk, DeleteFile)
    try:
        before = await ctx.io(_read_text, file_path)
    except NodeFsError as exc:
        raise ToolError(f"{VERIFICATION_FAILED}: Error: {exc}") from exc
    # Upstream counts the deleted lines this way (a final newline adds one), not with the line diff.
    return FileChange("delete", file_path, before, "", unified_diff(file_path, before, ""), 0, len(before.split("\n")))


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
    # The pattern is the source path even for a move; the metadata shows the destination.
    patterns = [_relative(ctx, change.file_path) for change in changes]
    await ctx.ask("edit", patterns, ["*"], {"filepath": ", ".join(patterns), "diff": total_diff, "files": files})

    try:
        await ctx.io(_apply, changes)
    except NodeFsError as exc:
        raise ToolError(str(exc)) from exc
    output = "Success. Updated the following files:\n" + "\n".join(_summary_line(ctx, c) for c in changes)
    return ToolOutput(title=output, output=output, metadata={"diff": total_diff, "files": files, "diagnostics": {}})
