"""Path resolution and the external-directory check every path-taking tool performs first."""

from __future__ import annotations

import os

from sandbox_agent.tools.base import ToolContext
from sandbox_agent.tools.safe_open import Target, TooManyLinksError, inspect


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


def _real_escape(ctx: ToolContext, target: str, real: str | None = None) -> str | None:
    """Where a lexically inside `target` really leads when a symlink on its way points out, else None.

    Upstream's check is on the path text only; a workspace symlink (`link -> /tmp`) would then
    take writes and reads outside the project without an ask. `real`: the target already resolved by
    the caller, which then operates on exactly that (see safe_open); resolved here otherwise.
    """
    real = os.path.realpath(target) if real is None else real
    inside = _within(os.path.realpath(ctx.directory), real) or (
        ctx.worktree != "/" and _within(os.path.realpath(ctx.worktree), real)
    )
    return None if inside else real


def outside_project(ctx: ToolContext, target: str, real: str | None = None) -> bool:
    """Whether `assert_external_directory` would ask for `target`."""
    return not contains_path(ctx, target) or _real_escape(ctx, target, real) is not None


async def assert_external_directory(ctx: ToolContext, target: str | None, *, kind: str = "file",
                                    bypass: bool = False, real: str | None = None) -> None:
    """Asks `external_directory` for a target outside the project; `kind` is "file" or "directory".

    A target whose path text is inside but which a symlink leads out of is asked for where it
    really goes (an intentional divergence from v1.2.27's text-only check).
    """
    if not target or bypass:
        return
    if contains_path(ctx, target):
        escaped = _real_escape(ctx, target, real)  # a few lstat calls: cheaper inline than a thread hop
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


async def checked_target(ctx: ToolContext, path: str) -> Target:
    """`path` resolved once (see safe_open): the asks name its spellings, the operation uses `.real`.

    A few lstat calls on the loop's thread; only a multiply-linked file's name scan goes to an io thread.
    """
    target = ctx.io_now(inspect, path, None)
    if target.needs_link_scan:
        target = await ctx.io(inspect, path, ctx.directory)
    return target


def read_denied(ctx: ToolContext, names: list[str]) -> bool:
    """Whether a `read` deny of the session's rules covers any of `names` (given, real, other links).

    Only a deny counts: the rules the control plane sent are never used here to allow anything.
    """
    rules = ctx.rules
    if rules is None or not rules.may_deny("read"):
        return False
    return any(rules.action("read", name) == "deny" for name in names)


def path_names(path: str, workspace: str) -> list[str] | None:
    """The names rules must see for a path found by a walk (glob, list, grep): as found, resolved, and a
    multiply-linked file's other workspace names; None when those could not all be found (leave it out).

    Runs through `ctx.io`.
    """
    try:
        target = inspect(path, workspace)
    except TooManyLinksError:
        return None
    return target.names


async def without_read_denied(ctx: ToolContext, paths: list[str], keep: int | None = None) -> list[str]:
    """`paths` (absolute, as a walk found them) in order, less those a `read` deny covers by any of their
    names; with `keep`, the scan stops once that many are kept (glob and list show a bounded page)."""
    rules = ctx.rules
    if rules is None or not rules.may_deny("read"):
        return paths if keep is None else paths[:keep]

    def scan() -> list[str]:
        kept: list[str] = []
        for path in paths:
            if keep is not None and len(kept) >= keep:
                break
            names = path_names(path, ctx.directory)
            if names is not None and not any(rules.action("read", name) == "deny" for name in names):
                kept.append(path)
        return kept

    return await ctx.io(scan)


PATH_PERMISSIONS = frozenset({"read", "edit", "list"})
"""Permissions whose patterns are file paths (as the built-in tools spell them)."""
_GLOB_CHARS = frozenset("*?[")


async def with_real_spellings(ctx: ToolContext, permission: str, patterns: list[str]) -> list[str]:
    """A custom tool's ask patterns, each path followed by where it really leads (and its other hard-link
    names), spelled like the pattern: absolute stays absolute, a relative one stays relative to its base (the
    worktree for `edit`, as upstream spells it, else the project directory). Globs and other permissions are
    left as they are. The tool then does its own file IO: see docs/security.md for what that leaves open."""
    if permission not in PATH_PERMISSIONS:
        return patterns
    base = ctx.worktree if permission == "edit" and ctx.worktree != "/" else ctx.directory
    out = list(patterns)
    for pattern in patterns:
        if not pattern or _GLOB_CHARS & set(pattern):
            continue
        absolute = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
        target = await checked_target(ctx, absolute)
        for name in target.spellings:
            spelled = _spelled_like(pattern, name, base)
            if spelled not in out:
                out.append(spelled)
    return out


def _spelled_like(pattern: str, name: str, base: str) -> str:
    """`name` (absolute) absolute when `pattern` is, else relative to `base` (both absolute: no cwd involved)."""
    return name if os.path.isabs(pattern) else os.path.relpath(name, base)
