"""The built-in tools: their ids in upstream's registry order, and where each one runs.

Every built-in has a module of the same name in the control plane's `controlplane/tools/` (its parameters and
`.txt` description); one that runs in the sandbox also has a module of that name in the agent's
`sandbox_agent/tools/` (its `run`). Both sides load their modules from this list, so a tool is added here once
(see docs/tools.md, "Adding a built-in tool"); tests/unit/opencode_semantics/test_tool_catalogue.py checks that
each side's modules are exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Place = Literal["control_plane", "sandbox"]


@dataclass(frozen=True)
class BuiltinTool:
    id: str
    runs_in: Place
    """Where `execute` happens: the control plane itself, or the session's sandbox agent."""
    listed: bool = True
    """Upstream's registry lists it; the others (`list`, `multiedit`, `todoread`) are defined upstream but not
    registered, and an operator opts in to them."""

    @property
    def module(self) -> str:
        """The module's name in each side's tools package (the id: upstream's ids are valid module names)."""
        return self.id


_CP: Place = "control_plane"
_SB: Place = "sandbox"

BUILTIN_TOOLS: tuple[BuiltinTool, ...] = (
    # Upstream's registry order ...
    BuiltinTool("invalid", _CP),
    BuiltinTool("question", _CP),
    BuiltinTool("bash", _SB),
    BuiltinTool("read", _SB),
    BuiltinTool("glob", _SB),
    BuiltinTool("grep", _SB),
    BuiltinTool("edit", _SB),
    BuiltinTool("write", _SB),
    BuiltinTool("task", _CP),
    BuiltinTool("webfetch", _CP),
    BuiltinTool("todowrite", _CP),
    BuiltinTool("websearch", _CP),
    BuiltinTool("codesearch", _CP),
    BuiltinTool("skill", _SB),
    BuiltinTool("apply_patch", _SB),
    BuiltinTool("lsp", _SB),
    BuiltinTool("batch", _CP),
    BuiltinTool("plan_exit", _CP),
    # ... then the unregistered ones, in the order they are placed after the built-ins when enabled.
    BuiltinTool("list", _SB, listed=False),
    BuiltinTool("multiedit", _SB, listed=False),
    BuiltinTool("todoread", _CP, listed=False),
)

BY_ID = {tool.id: tool for tool in BUILTIN_TOOLS}
LISTED_IDS = tuple(tool.id for tool in BUILTIN_TOOLS if tool.listed)
"""Upstream's registry order."""
UNLISTED_IDS = tuple(tool.id for tool in BUILTIN_TOOLS if not tool.listed)
SANDBOX_IDS = frozenset(tool.id for tool in BUILTIN_TOOLS if tool.runs_in == "sandbox")
