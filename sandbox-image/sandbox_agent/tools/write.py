"""The `write` tool: create or overwrite a whole file (an existing one must have been read first)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.diffs import unified_diff
from sandbox_agent.tools.edit import ask_edit, assert_read, load_file, store_file
from sandbox_agent.tools.paths import as_given, assert_external_directory, checked_target, relative_to_worktree

WROTE = "Wrote file successfully."
# Upstream reads the old content before anything else and fails with Node's readFile error on a directory.
_DIRECTORY = "EISDIR: illegal operation on a directory, read"


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    content = str(args.get("content") or "")
    path = as_given(ctx, str(args.get("filePath") or ""))
    target = await checked_target(ctx, path)
    await assert_external_directory(ctx, path, real=target.real)
    async with ctx.file_times.lock(path):
        disk = await load_file(ctx, target)
        if disk.kind == "directory":
            raise ToolError(_DIRECTORY)
        exists = disk.kind == "file"
        if exists:
            assert_read(ctx, path, disk.mtime_ns)
        diff = await asyncio.to_thread(unified_diff, path, disk.content, content)
        await ask_edit(ctx, target, diff)
        await store_file(ctx, target, content)
        ctx.file_times.read(path, time.time())
    return ToolOutput(title=relative_to_worktree(ctx, path), output=WROTE,
                      metadata={"diagnostics": {}, "filepath": path, "exists": exists})
