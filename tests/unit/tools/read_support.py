"""What the read tool's test files share: the context factory's type and the envelope a file's content comes in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sandbox_agent.tools.base import ToolContext

MakeCtx = Callable[..., ToolContext]


def envelope(path: Path, body: str) -> str:
    return f"<path>{path}</path>\n<type>file</type>\n<content>{body}\n</content>"
