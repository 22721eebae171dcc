"""Path resolution and the external-directory check every path-taking tool performs first."""

from __future__ import annotations

import os

from sandbox_agent.tools.base import ToolContext


def resolve(ctx: ToolContext, path: str) -> str:
    """An absolute, normalised path; relative ones are taken from the project directory."""
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(ctx.directory, path))


def as_given(ctx: ToolContext, path: str) -> str:
    """Upstream's `isAbsolute(p) ? p : resolve(directory, p)`: an absolute path is kept exactly as written.

    read, write and edit show the path the model gave (`<path>/w/src/</path>`, `File /w/./a not found`);
    only a relative one is joined to the project directory and normalised.
    """
    return path if os.path.isabs(path) else resolve(ctx, path)


def _directory_glob(parent: str) -> str:
    # Node's path.join normalises: a target given as `/w/../etc/x` asks for `/etc/*`.
    return os.path.normpath(os.path.join(parent, "*")).replace("\\", "/")


def node_dirname(path: str) -> str:
    """Node's `path.dirname`: trailing slashes are not a last, empty component (`/a/b/` -> `/a`)."""
    stripped = path.rstrip("/")
    return os.path.dirname(stripped) if stripped else "/"


def _within(parent: str, child: str) -> bool:
    rel = os.path.relpath(child, parent)
    return not rel.startswith("..")


def contains_path(ctx: ToolContext, target: str) -> bool:
    """Inside the project directory, or inside the git worktree (a worktree of "/" does not count)."""
    if _within(ctx.directory, target):
        return True
    return ctx.worktree != "/" and _within(ctx.worktree, target)


def _real_escape(ctx: ToolContext, target: str) -> str | None:
    """Where a lexically inside `target` really leads when a symlink on its way points out, else None.

    Upstream's check is on the path text only; a workspace symlink (`link -> /tmp`) would then
    take writes and reads outside the project without an ask.
    """
    real = os.path.realpath(target)
    inside = _within(os.path.realpath(ctx.directory), real) or (
        ctx.worktree != "/" and _within(os.path.realpath(ctx.worktree), real)
    )
    return None if inside else real


def outside_project(ctx: ToolContext, target: str) -> bool:
    """Whether `assert_external_directory` would ask for `target`."""
    return not contains_path(ctx, target) or _real_escape(ctx, target) is not None


async def assert_external_directory(ctx: ToolContext, target: str | None, *, kind: str = "file",
                                    bypass: bool = False) -> None:
    """Asks `external_directory` for a target outside the project; `kind` is "file" or "directory".

    A target whose path text is inside but which a symlink leads out of is asked for where it
    really goes (an intentional divergence from v1.2.27's text-only check).
    """
    if not target or bypass:
        return
    if contains_path(ctx, target):
        escaped = _real_escape(ctx, target)  # a few lstat calls: cheaper inline than a thread hop
        if escaped is None:
            return
        target = escaped
    parent = target if kind == "directory" else node_dirname(target)
    glob = _directory_glob(parent)
    await ctx.ask("external_directory", [glob], [glob], {"filepath": target, "parentDir": parent})


def relative_to_worktree(ctx: ToolContext, path: str) -> str:
    """Node's `path.relative(worktree, path)`: "" (not ".") for the worktree itself; "/" outside git."""
    title = os.path.relpath(path, ctx.worktree)
    return "" if title == "." else title
