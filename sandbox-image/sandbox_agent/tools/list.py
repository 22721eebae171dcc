"""The `list` tool (upstream's ls.ts): a tree of up to 100 files under a directory, common junk ignored."""

from __future__ import annotations

import posixpath
from typing import Any

from sandbox_agent.tools.base import ToolContext, ToolOutput
from sandbox_agent.tools.collation import code_unit_key
from sandbox_agent.tools.glob import rg_files
from sandbox_agent.tools.paths import (
    assert_external_directory,
    relative_to_worktree,
    resolve,
    without_read_denied,
)

LIMIT = 100
IGNORE_PATTERNS = [
    "node_modules/", "__pycache__/", ".git/", "dist/", "build/", "target/", "vendor/", "bin/", "obj/", ".idea/",
    ".vscode/", ".zig-cache/", "zig-out", ".coverage", "coverage/", "tmp/", "temp/", ".cache/", "cache/", "logs/",
    ".venv/", "venv/", "env/",
]


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    search = resolve(ctx, args.get("path") or ".")
    await assert_external_directory(ctx, search, kind="directory")
    await ctx.ask("list", [search], ["*"], {"path": search})

    globs = [f"!{pattern}*" for pattern in IGNORE_PATTERNS]
    globs += [f"!{pattern}" for pattern in args.get("ignore") or []]
    found = await rg_files(ctx, search, globs)
    if ctx.rules is not None and ctx.rules.may_deny("read"):
        # Files a read deny covers (by their name or where a link leads) are not shown.
        kept = set(await without_read_denied(ctx, [posixpath.join(search, name) for name in found], keep=LIMIT))
        found = [name for name in found if posixpath.join(search, name) in kept]
    files = found[:LIMIT]
    return ToolOutput(title=relative_to_worktree(ctx, search), output=f"{search}/\n" + render_tree(files),
                      metadata={"count": len(files), "truncated": len(files) >= LIMIT})


def render_tree(files: list[str]) -> str:
    """Indented tree of relative file paths: each directory's subdirectories first, then its files."""
    dirs: set[str] = set()
    files_by_dir: dict[str, list[str]] = {}
    for file in files:
        parent = _dirname(file)
        parts = [] if parent == "." else parent.split("/")
        dirs.add(".")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        files_by_dir.setdefault(parent, []).append(posixpath.basename(file))

    def render(directory: str, depth: int) -> str:
        out = f"{'  ' * depth}{posixpath.basename(directory)}/\n" if depth > 0 else ""
        children = sorted((d for d in dirs if d != directory and _dirname(d) == directory), key=code_unit_key)
        for child in children:
            out += render(child, depth + 1)
        for name in sorted(files_by_dir.get(directory, []), key=code_unit_key):
            out += f"{'  ' * (depth + 1)}{name}\n"
        return out

    return render(".", 0)


def _dirname(path: str) -> str:
    """Node's `path.dirname` for relative paths: "." when there is no directory part."""
    return posixpath.dirname(path) or "."
