"""The `edit` tool: replace one string in a file (fuzzy matching in `replacers`), or create a file from nothing.

Also holds what `write` and `multiedit` share with it: the read-before-write check, file IO and the diff metadata.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sandbox_agent.tools.base import IO_NOW_BYTES, ToolContext, ToolError, ToolOutput, stat_or_none
from sandbox_agent.tools.diffs import count_changes, unified_diff
from sandbox_agent.tools.paths import as_given, assert_external_directory, checked_target, relative_to_worktree
from sandbox_agent.tools.replacers import IDENTICAL, replace
from sandbox_agent.tools.safe_open import MakeDirError, Target, open_checked, write_bytes

APPLIED = "Edit applied successfully."
FILETIME_TOLERANCE_MS = 50
"""A file modified up to this long after it was read still counts as read (coarse or lagging timestamps)."""
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class OnDisk:
    """What a path holds: `kind` is "missing", "directory" or "file"; content and mtime only for a file."""

    kind: str
    content: str = ""
    mtime_ns: int | None = None


def load(target: Target) -> OnDisk:
    """Stats and reads the checked file in one go (runs through `ctx.io`); text is UTF-8, bad bytes become U+FFFD.

    The file is opened as it was checked (safe_open): a link swapped since then stops the call.
    """
    if target.identity is None:
        return OnDisk("missing")
    if target.is_dir:
        try:
            return OnDisk("directory", mtime_ns=os.lstat(target.real).st_mtime_ns)
        except OSError:
            return OnDisk("missing")
    try:
        # O_NONBLOCK keeps a FIFO from hanging the call; it changes nothing for regular files.
        fd = open_checked(target, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return OnDisk("missing")
    try:
        mtime_ns = os.fstat(fd).st_mtime_ns
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return OnDisk("file", b"".join(chunks).decode("utf-8", errors="replace"), mtime_ns)


async def load_file(ctx: ToolContext, target: Target) -> OnDisk:
    """`load` as the tool user: on the loop's thread for a small regular file, a directory or nothing there."""
    info = ctx.io_now(stat_or_none, target.real)
    if info is None or stat.S_ISDIR(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_size <= IO_NOW_BYTES):
        return ctx.io_now(load, target)
    return await ctx.io(load, target)


async def store_file(ctx: ToolContext, target: Target, text: str) -> None:
    """`store` as the tool user: on the loop's thread for a small text (a file it replaces was loaded first)."""
    if len(text) <= IO_NOW_BYTES // 4:  # at most 4 UTF-8 bytes per character
        ctx.io_now(store, target, text)
    else:
        await ctx.io(store, target, text)


def store(target: Target, text: str) -> None:
    """Writes UTF-8 text to the checked file (runs through `ctx.io`), creating missing parent directories as
    upstream does on ENOENT; nothing on the way is followed again (safe_open)."""
    data = _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")  # Node writes a lone surrogate as U+FFFD
    try:
        write_bytes(target, data)
    except IsADirectoryError:
        raise ToolError(f"EISDIR: illegal operation on a directory, open '{target.path}'") from None
    except MakeDirError as failed:
        raise failed.error from None


def iso_time(ms: int) -> str:
    """JavaScript's `Date.prototype.toISOString()` for a millisecond timestamp."""
    moment = datetime.fromtimestamp(ms // 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def assert_read(ctx: ToolContext, path: str, mtime_ns: int | None) -> None:
    """Refuses to overwrite a file this session has not read, or that changed since it was read."""
    if ctx.extra.get("disable_filetime_check"):
        return
    read = ctx.file_times.last_read(path)
    if read is None:
        raise ToolError(f"You must read file {path} before overwriting it. Use the Read tool first")
    # Whole milliseconds on both sides, as JavaScript Dates hold them (the epsilon absorbs float error).
    read_ms = math.floor(read * 1000 + 1e-3)
    if mtime_ns is None:
        return
    mtime_ms = mtime_ns // 1_000_000
    if mtime_ms > read_ms + FILETIME_TOLERANCE_MS or ctx.file_times.changed_since_read(path):
        raise ToolError(f"File {path} has been modified since it was last read.\n"
                        f"Last modification: {iso_time(mtime_ms)}\nLast read: {iso_time(read_ms)}\n\n"
                        "Please read the file again before modifying it.")


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def apply_edit(content: str, old: str, new: str, replace_all: bool) -> str:
    """One replacement, with `old`/`new` converted to the file's line endings (CRLF if it has any)."""
    ending = "\r\n" if "\r\n" in content else "\n"
    old, new = _lf(old), _lf(new)
    if ending == "\r\n":
        old, new = old.replace("\n", ending), new.replace("\n", ending)
    return replace(content, old, new, replace_all)


def edit_metadata(path: str, before: str, after: str, *, normalise: bool = True) -> dict[str, Any]:
    """The result metadata: the diff (over LF-normalised text, unless `normalise` is off as for a file made from
    an empty oldString) and the line counts (over the raw text)."""
    diff = unified_diff(path, _lf(before), _lf(after)) if normalise else unified_diff(path, before, after)
    additions, deletions = count_changes(before, after)
    filediff = {"file": path, "before": before, "after": after, "additions": additions, "deletions": deletions}
    return {"diagnostics": {}, "diff": diff, "filediff": filediff}


def edit_patterns(ctx: ToolContext, target: Target) -> list[str]:
    """`edit`'s patterns: the path as given, then (when a link leads elsewhere) where it really leads and a
    multiply-linked file's other names, all spelled as upstream spells the first (relative to the worktree)."""
    return [relative_to_worktree(ctx, name).replace("\\", "/") for name in target.shown]


async def ask_edit(ctx: ToolContext, target: Target, diff: str) -> None:
    patterns = edit_patterns(ctx, target)
    checks = [spelled for name in target.respellings
              if (spelled := relative_to_worktree(ctx, name).replace("\\", "/")) not in patterns]
    await ctx.ask("edit", patterns, ["*"], {"filepath": target.path, "diff": diff}, checks)


def edit_args(args: dict[str, Any]) -> tuple[str, str, bool]:
    """oldString, newString and replaceAll of one edit, refusing a no-op."""
    old, new = args.get("oldString") or "", args.get("newString") or ""
    if old == new:
        raise ToolError(IDENTICAL)
    return old, new, bool(args.get("replaceAll"))


def required_path(args: dict[str, Any]) -> str:
    file_path = args.get("filePath")
    if not file_path:
        raise ToolError("filePath is required")
    return str(file_path)


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    file_path = required_path(args)
    old, new, replace_all = edit_args(args)
    path = as_given(ctx, file_path)
    target = await checked_target(ctx, path)
    await assert_external_directory(ctx, path, real=target.real)
    async with ctx.file_times.lock(path):
        if old == "":
            # Creation or a full overwrite: no read is required, the old content counts as empty, and (unlike
            # an edit of existing text) the diff shows newString's line endings as they are.
            before, after = "", new
            meta = await asyncio.to_thread(lambda: edit_metadata(path, before, after, normalise=False))
        else:
            disk = await load_file(ctx, target)
            if disk.kind == "missing":
                raise ToolError(f"File {path} not found")
            if disk.kind == "directory":
                raise ToolError(f"Path is a directory, not a file: {path}")
            assert_read(ctx, path, disk.mtime_ns)
            before = disk.content

            def compute() -> tuple[str, dict[str, Any]]:
                changed = apply_edit(before, old, new, replace_all)
                return changed, edit_metadata(path, before, changed)

            after, meta = await asyncio.to_thread(compute)
        await ask_edit(ctx, target, meta["diff"])
        await store_file(ctx, target, after)
        ctx.file_times.read(path, time.time())
    await ctx.metadata(None, {"diff": meta["diff"], "filediff": meta["filediff"], "diagnostics": {}})
    return ToolOutput(title=relative_to_worktree(ctx, path), output=APPLIED, metadata=meta)
