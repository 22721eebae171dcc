"""The tool registry: built-ins in OpenCode's order, then custom, plugin and MCP tools.

Built-ins that are not implemented are simply not handed to the registry; their slots are skipped.
`list`, `multiedit` and `todoread` are defined upstream but not registered; an operator may opt in
to them (`extra`), and they are then placed after the built-ins, in that order.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.core.calls.tool import InitContext, ToolDefinition, ToolInfo, ToolSource
from controlplane.errors import ConfigError
from opencode_semantics.tools import LISTED_IDS, UNLISTED_IDS

BUILTIN_ORDER = LISTED_IDS
EXTRA_ORDER = UNLISTED_IDS
"""Defined but not registered by upstream; enabled only through `extra`."""

_QUESTION_CLIENTS = frozenset({"app", "cli", "desktop"})
_EXA_TOOLS = frozenset({"websearch", "codesearch"})


def _truthy(env: Mapping[str, str], key: str) -> bool:
    return env.get(key, "").lower() in ("true", "1")


@dataclass(frozen=True)
class Flags:
    """The `OPENCODE_*` environment flags the registry depends on."""

    client: str = "cli"
    question_tool: bool = False
    lsp_tool: bool = False
    plan_mode: bool = False
    exa: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Flags:
        experimental = _truthy(env, "OPENCODE_EXPERIMENTAL")
        return cls(
            # An empty OPENCODE_CLIENT is kept as "": upstream only defaults a missing variable.
            client=env.get("OPENCODE_CLIENT", "cli"),
            question_tool=_truthy(env, "OPENCODE_ENABLE_QUESTION_TOOL"),
            lsp_tool=_truthy(env, "OPENCODE_EXPERIMENTAL_LSP_TOOL") or experimental,
            plan_mode=_truthy(env, "OPENCODE_EXPERIMENTAL_PLAN_MODE") or experimental,
            exa=_truthy(env, "OPENCODE_ENABLE_EXA") or experimental or _truthy(env, "OPENCODE_EXPERIMENTAL_EXA"),
        )


def batch_tool_enabled(config: Mapping[str, Any] | None) -> bool:
    """Config `experimental.batch_tool`, which must be exactly `true`."""
    experimental = (config or {}).get("experimental")
    return isinstance(experimental, Mapping) and experimental.get("batch_tool") is True


def use_apply_patch(model_id: str) -> bool:
    """GPT models (except gpt-4* and the open-weight gpt-oss) get apply_patch instead of edit/write."""
    return "gpt-" in model_id and "oss" not in model_id and "gpt-4" not in model_id


class Registry:
    def __init__(
        self,
        builtins: Mapping[str, ToolInfo],
        *,
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        extra: Iterable[str] = (),
    ) -> None:
        unknown = set(builtins) - set(BUILTIN_ORDER) - set(EXTRA_ORDER)
        if unknown:
            raise ConfigError(f"not built-in tool ids: {', '.join(sorted(unknown))}")
        bad_extra = set(extra) - set(EXTRA_ORDER)
        if bad_extra:
            raise ConfigError(f"only {', '.join(EXTRA_ORDER)} can be enabled as extra tools, not {sorted(bad_extra)}")
        self.flags = Flags.from_env(env or {})
        self._builtins = dict(builtins)
        self._extra = set(extra)
        self._enabled = self._enabled_builtins(batch_tool_enabled(config), self._extra)
        self._added: dict[ToolSource, list[ToolInfo]] = {s: [] for s in ToolSource if s is not ToolSource.BUILTIN}

    def _enabled_builtins(self, batch: bool, extra: set[str]) -> list[str]:
        f = self.flags
        wanted = {
            "question": f.client in _QUESTION_CLIENTS or f.question_tool,
            "lsp": f.lsp_tool,
            "batch": batch,
            "plan_exit": f.plan_mode and f.client == "cli",
        }
        ids = [i for i in BUILTIN_ORDER if wanted.get(i, True)]
        return ids + [i for i in EXTRA_ORDER if i in extra]

    def for_session(self, config: Mapping[str, Any] | None) -> Registry:
        """The registry as a session with this opencode.json sees it: `batch` is also enabled by the
        session's own `experimental.batch_tool` (tools registered later show in both)."""
        if "batch" in self._enabled or not batch_tool_enabled(config):
            return self
        view = copy.copy(self)
        view._enabled = self._enabled_builtins(True, self._extra)
        return view

    def register(self, tool: ToolInfo) -> None:
        """Adds a tool to its source's group, replacing one of the same id there."""
        if tool.source is ToolSource.BUILTIN:
            if tool.id not in BUILTIN_ORDER and tool.id not in EXTRA_ORDER:
                raise ConfigError(f"not a built-in tool id: {tool.id}")
            self._builtins[tool.id] = tool
            return
        group = self._added[tool.source]
        for i, existing in enumerate(group):
            if existing.id == tool.id:
                group[i] = tool
                return
        group.append(tool)

    def all(self) -> list[ToolInfo]:
        """Every tool in order (built-in, custom, plugin, MCP); ids may repeat, as upstream's."""
        builtins = [self._builtins[i] for i in self._enabled if i in self._builtins]
        return builtins + [t for source in (ToolSource.CUSTOM, ToolSource.PLUGIN, ToolSource.MCP)
                           for t in self._added[source]]

    def ids(self) -> list[str]:
        return [t.id for t in self.all()]

    def get(self, tool_id: str) -> ToolInfo | None:
        """The tool a call to `tool_id` runs (the last registered wins), ignoring the model filter."""
        found = None
        for tool in self.all():
            if tool.id == tool_id:
                found = tool
        return found

    def tools(self, provider_id: str, model_id: str) -> list[ToolInfo]:
        """The tools a model is offered, each id once.

        Filtering is by id, so it also drops a custom tool named `edit` for a GPT-5 model. On a
        collision the later tool wins but sits where the id first appeared (a JS object's order).
        `invalid` stays in the list and permission-disabled tools are not removed here: both are
        the caller's concern (`permission.disabled`).
        """
        patch = use_apply_patch(model_id)
        exa = provider_id == "opencode" or self.flags.exa
        chosen: dict[str, ToolInfo] = {}
        for tool in self.all():
            if tool.id in _EXA_TOOLS and not exa:
                continue
            if tool.id == "apply_patch" and not patch:
                continue
            if tool.id in ("edit", "write") and patch:
                continue
            chosen[tool.id] = tool
        return list(chosen.values())

    async def definitions(
        self, provider_id: str, model_id: str, agent: str | None,
    ) -> list[tuple[ToolInfo, ToolDefinition]]:
        """`tools()` each initialised for `agent` (descriptions may depend on it)."""
        ctx = InitContext(agent=agent)
        return [(tool, await tool.init(ctx)) for tool in self.tools(provider_id, model_id)]
