"""The `multiedit` tool: several edits to one file, applied in order in memory and written once.

Platform decisions that differ from OpenCode v1.2.27 (where it runs the edit tool once per edit):
- atomic: if any edit fails, nothing is written and that edit's error is returned (upstream keeps the earlier ones);
- one `edit` permission ask for the combined diff, instead of one ask per edit;
- the result metadata also carries the combined `diff`/`filediff`/`diagnostics` next to the per-edit `results`.
As upstream, every edit applies to the top-level `filePath` (an edit's own `filePath` is ignored), and an edit with
an empty `oldString` replaces the whole content.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.edit import (
    APPLIED,
    apply_edit,
    ask_edit,
    assert_read,
    edit_args,
    edit_metadata,
    load_file,
    required_path,
    store_file,
)
from sandbox_agent.tools.paths import as_given, assert_external_directory, checked_target, relative_to_worktree

NO_EDITS = "edits must contain at least one edit"


def _apply_all(path: str, original: str, edits: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The final content and each edit's metadata, as the edit tool would report it for that step."""
    content = original
    results: list[dict[str, Any]] = []
    for item in edits:
        old, new, replace_all = edit_args(item)
        before = "" if old == "" else content
        content = new if old == "" else apply_edit(content, old, new, replace_all)
        results.append(edit_metadata(path, before, content, normalise=old != ""))
    return content, results


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    file_path = required_path(args)
    edits = [dict(item) for item in args.get("edits") or []]
    if not edits:
        raise ToolError(NO_EDITS)
    path = as_given(ctx, file_path)
    first_old = edit_args(edits[0])[0]
    target = await checked_target(ctx, path)
    await assert_external_directory(ctx, path, real=target.real)
    async with ctx.file_times.lock(path):
        disk = await load_file(ctx, target)
        if disk.kind == "directory":
            raise ToolError(f"Path is a directory, not a file: {path}")
        # Only the first edit meets the file as it is on disk: after it, the content is the tool's own.
        if first_old != "":
            if disk.kind == "missing":
                raise ToolError(f"File {path} not found")
            assert_read(ctx, path, disk.mtime_ns)

        def compute() -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
            final, results = _apply_all(path, disk.content, edits)
            return final, results, edit_metadata(path, disk.content, final)

        final, results, combined = await asyncio.to_thread(compute)
        await ask_edit(ctx, target, combined["diff"])
        await store_file(ctx, target, final)
        ctx.file_times.read(path, time.time())
    await ctx.metadata(None, {"diff": combined["diff"], "filediff": combined["filediff"], "diagnostics": {}})
    return ToolOutput(title=relative_to_worktree(ctx, path), output=APPLIED, metadata={"results": results, **combined})
