"""Every built-in tool this platform implements, by id, built from the operator's settings.

The ids and modules are the shared catalogue's (`opencode_semantics.tools`), which the sandbox agent loads its
side from too.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane import egress
from controlplane.core.calls.tool import ToolInfo
from controlplane.core.definitions.registry import BUILTIN_ORDER, EXTRA_ORDER
from controlplane.tools import codesearch, webfetch, websearch
from controlplane.tools.description_overrides import described
from opencode_semantics.tools import BUILTIN_TOOLS

_CONFIGURED = {"webfetch", "websearch", "codesearch"}
"""Built from the operator's settings (egress, search) rather than a module's fixed `TOOL`."""


@dataclass(frozen=True)
class ToolSettings:
    """What configured tools need from the operator's config."""

    egress: egress.EgressPolicy = field(default_factory=egress.EgressPolicy)
    search: websearch.SearchConfig = field(default_factory=websearch.SearchConfig)
    descriptions: Mapping[str, str] = field(default_factory=dict)
    """The operator's description texts by tool id (`tools.descriptions_dir`)."""


def implemented(settings: ToolSettings | None = None) -> dict[str, ToolInfo]:
    settings = settings or ToolSettings()
    tools: dict[str, ToolInfo] = {}
    for tool in BUILTIN_TOOLS:
        if tool.id not in _CONFIGURED:
            tools[tool.id] = importlib.import_module(f"controlplane.tools.{tool.module}").TOOL
    tools["webfetch"] = webfetch.make_tool(settings.egress)
    tools["websearch"] = websearch.make_tool(settings.search, settings.egress)
    tools["codesearch"] = codesearch.make_tool(settings.search, settings.egress)
    return described(tools, settings.descriptions)


def tool_ids() -> frozenset[str]:
    """Every built-in tool's id, listed or not."""
    return frozenset(tool.id for tool in BUILTIN_TOOLS)


def registered(tools: dict[str, ToolInfo]) -> dict[str, ToolInfo]:
    """The ones upstream's registry lists."""
    return {k: v for k, v in tools.items() if k in BUILTIN_ORDER}


def unregistered(tools: dict[str, ToolInfo]) -> dict[str, ToolInfo]:
    """Defined upstream but not registered (`list`, `multiedit`, `todoread`): callable, not listed."""
    return {k: v for k, v in tools.items() if k in EXTRA_ORDER}
