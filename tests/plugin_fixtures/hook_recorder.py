"""An operator plugin for the hook and MCP call tests: records what each hook saw, refuses one MCP call."""

from __future__ import annotations

from typing import Any

from controlplane.plugins import PluginInput

SEEN: list[tuple[str, dict[str, Any]]] = []
REFUSAL = "MCP call refused by policy"


async def before(input_: dict[str, Any], output: dict[str, Any]) -> None:
    SEEN.append(("tool.execute.before", dict(input_)))
    if output["args"].get("text") == "refuse me":
        raise RuntimeError(REFUSAL)


async def definition(input_: dict[str, Any], output: dict[str, Any]) -> None:
    SEEN.append(("tool.definition", dict(input_)))
    output["description"] = output["description"] + " [seen by tool.definition]"


async def shell_env(input_: dict[str, Any], output: dict[str, Any]) -> None:
    SEEN.append(("shell.env", dict(input_)))
    output["env"]["W3_FROM_HOOK"] = "yes"


def plugin(_: PluginInput) -> dict[str, Any]:
    return {"tool.execute.before": before, "tool.definition": definition, "shell.env": shell_env}
