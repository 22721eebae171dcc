"""Every built-in tool this platform implements, by id."""

from __future__ import annotations

import importlib

from controlplane.core.registry import BUILTIN_ORDER, EXTRA_ORDER
from controlplane.core.tool import ToolInfo

_MODULES = {
    "invalid": "invalid", "bash": "bash", "read": "read", "glob": "glob", "grep": "grep", "edit": "edit",
    "write": "write", "apply_patch": "apply_patch", "list": "list", "multiedit": "multiedit",
}


def implemented() -> dict[str, ToolInfo]:
    tools: dict[str, ToolInfo] = {}
    for tool_id, module in _MODULES.items():
        tool: ToolInfo = importlib.import_module(f"controlplane.tools.{module}").TOOL
        tools[tool_id] = tool
    return tools


def registered(tools: dict[str, ToolInfo]) -> dict[str, ToolInfo]:
    """The ones upstream's registry lists."""
    return {k: v for k, v in tools.items() if k in BUILTIN_ORDER}


def unregistered(tools: dict[str, ToolInfo]) -> dict[str, ToolInfo]:
    """Defined upstream but not registered (`list`, `multiedit`): callable, not listed."""
    return {k: v for k, v in tools.items() if k in EXTRA_ORDER}
