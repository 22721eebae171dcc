"""Every built-in tool this platform implements, by id, built from the operator's settings."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from controlplane import egress
from controlplane.core.calls.tool import ToolInfo
from controlplane.core.definitions.registry import BUILTIN_ORDER, EXTRA_ORDER
from controlplane.tools import codesearch, webfetch, websearch

_MODULES = {
    "invalid": "invalid", "bash": "bash", "read": "read", "glob": "glob", "grep": "grep", "edit": "edit",
    "write": "write", "apply_patch": "apply_patch", "list": "list", "multiedit": "multiedit", "skill": "skill",
    "lsp": "lsp", "task": "task", "todowrite": "todowrite", "todoread": "todoread", "question": "question",
    "batch": "batch", "plan_exit": "plan_exit",
}


@dataclass(frozen=True)
class ToolSettings:
    """What configured tools need from the operator's config."""

    egress: egress.EgressPolicy = field(default_factory=egress.EgressPolicy)
    search: websearch.SearchConfig = field(default_factory=websearch.SearchConfig)


def implemented(settings: ToolSettings | None = None) -> dict[str, ToolInfo]:
    settings = settings or ToolSettings()
    tools: dict[str, ToolInfo] = {}
    for tool_id, module in _MODULES.items():
        tool: ToolInfo = importlib.import_module(f"controlplane.tools.{module}").TOOL
        tools[tool_id] = tool
    tools["webfetch"] = webfetch.make_tool(settings.egress)
    tools["websearch"] = websearch.make_tool(settings.search, settings.egress)
    tools["codesearch"] = codesearch.make_tool(settings.search, settings.egress)
    return tools


def registered(tools: dict[str, ToolInfo]) -> dict[str, ToolInfo]:
    """The ones upstream's registry lists."""
    return {k: v for k, v in tools.items() if k in BUILTIN_ORDER}


def unregistered(tools: dict[str, ToolInfo]) -> dict[str, ToolInfo]:
    """Defined upstream but not registered (`list`, `multiedit`, `todoread`): callable, not listed."""
    return {k: v for k, v in tools.items() if k in EXTRA_ORDER}
