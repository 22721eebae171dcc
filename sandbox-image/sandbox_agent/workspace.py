"""Paths the control plane names, resolved against the workspace."""

from __future__ import annotations

import os

from sandbox_agent.errors import WorkspacePathError


def resolve_cwd(workspace: str, cwd: str) -> str:
    """A command's working directory: relative to the workspace, or any absolute path."""
    if not cwd:
        return workspace
    return os.path.normpath(cwd if os.path.isabs(cwd) else os.path.join(workspace, cwd))


def resolve_inside(workspace: str, path: str) -> str:
    """A path that must stay inside the workspace (symlinks resolved)."""
    root = os.path.realpath(workspace)
    resolved = os.path.realpath(os.path.join(root, path)) if path else root
    if resolved != root and not resolved.startswith(root + "/"):
        raise WorkspacePathError(f"{path!r} is outside the workspace {workspace}")
    return resolved
