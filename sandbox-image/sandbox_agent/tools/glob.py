"""The `glob` tool: files matching a glob under a directory (via `rg --files`), newest first.

Also home of what `list`, `grep` and `read` share: the `rg --files` walk, mtimes, the worktree title.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from typing import Any

from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.paths import (
    assert_external_directory,
    relative_to_worktree,
    resolve,
    without_read_denied,
)

LIMIT = 100
TRUNCATED = "(Results are truncated: showing first 100 results. Consider using a more specific path or pattern.)"
_NEWLINE = re.compile(r"\r?\n")


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    pattern = str(args["pattern"])
    raw_path = args.get("path")
    await ctx.ask("glob", [pattern], ["*"], defined({"pattern": pattern, "path": raw_path}))
    search = resolve(ctx, raw_path or ctx.directory)
    await assert_external_directory(ctx, search, kind="directory")

    found = await rg_files(ctx, search, [pattern])
    # A file a read deny covers (by its name or where a link leads) is left out before the page is cut.
    shown = await without_read_denied(ctx, [posixpath.normpath(posixpath.join(search, name)) for name in found],
                                      keep=LIMIT + 1)
    truncated = len(shown) > LIMIT
    paths = shown[:LIMIT]
    times = await ctx.io(mtimes_ms, paths)
    paths.sort(key=lambda p: -(times[p] or 0))  # stable: ties keep ripgrep's order

    if not paths:
        output = "No files found"
    else:
        output = "\n".join(paths) + (f"\n\n{TRUNCATED}" if truncated else "")
    return ToolOutput(title=relative_to_worktree(ctx, search), output=output,
                      metadata={"count": len(paths), "truncated": truncated})


async def rg_files(ctx: ToolContext, cwd: str, globs: list[str]) -> list[str]:
    """`rg --files` run in `cwd` (hidden files included, `.git` skipped, .gitignore honoured): relative paths."""
    if not await ctx.io(_is_directory, cwd):
        raise ToolError(f"No such file or directory: '{cwd}'")
    argv = ["rg", "--files", "--glob=!.git/*", "--hidden", *(f"--glob={glob}" for glob in globs)]
    result = await ctx.run(argv, cwd=cwd)
    text = result.stdout.decode("utf-8", errors="replace")
    return [line for line in _NEWLINE.split(text) if line]


def mtimes_ms(paths: list[str]) -> dict[str, int | None]:
    """Modification times in whole milliseconds (symlinks followed); None when a path cannot be stat'ed."""
    times: dict[str, int | None] = {}
    for path in paths:
        try:
            times[path] = os.stat(path).st_mtime_ns // 1_000_000
        except OSError:
            times[path] = None
    return times


def defined(values: dict[str, Any]) -> dict[str, Any]:
    """Upstream's `undefined` fields vanish from the permission request's metadata."""
    return {key: value for key, value in values.items() if value is not None}


def _is_directory(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False
