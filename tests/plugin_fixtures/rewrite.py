"""An operator plugin used by the tests: rewrites bash commands, edits outputs, observes events."""

from __future__ import annotations

from typing import Any

from controlplane.plugins import PluginInput

SEEN_EVENTS: list[dict[str, Any]] = []


async def before(input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any] | None:
    args = output["args"]
    if input_["tool"] == "bash" and args.get("command") == "echo original":
        # A replaced args object is used (upstream would drop it): that is the point of the test.
        return {"args": {**args, "command": "echo rewritten-by-plugin"}}
    if input_["tool"] == "bash" and args.get("command") == "echo explode":
        raise RuntimeError("refusing to run explode")
    return None


async def after(input_: dict[str, Any], output: dict[str, Any]) -> None:
    if input_["args"].get("command") == "echo after-fails":
        raise ValueError("after-hook bug")
    if input_["args"].get("command") == "echo decorate":
        output["title"] = "decorated"
        output["output"] = output["output"] + "[checked by plugin]"


async def shell_env(input_: dict[str, Any], output: dict[str, Any]) -> None:
    output["env"]["PLUGIN_INJECTED"] = f"from-plugin:{input_['sessionID'][:4]}"


async def definition(input_: dict[str, Any], output: dict[str, Any]) -> None:
    if input_["toolID"] == "glob":
        output["description"] = "Glob, as the operator describes it."


async def on_event(input_: dict[str, Any], output: dict[str, Any]) -> None:
    SEEN_EVENTS.append(input_["event"])


async def permission_ask(input_: dict[str, Any], output: dict[str, Any]) -> None:
    patterns = input_["pattern"]
    if any("auto-approved-by-plugin" in p for p in patterns):
        output["status"] = "allow"
    elif any("auto-denied-by-plugin" in p for p in patterns):
        output["status"] = "deny"


def plugin(_: PluginInput) -> dict[str, Any]:
    return {
        "tool.execute.before": before,
        "tool.execute.after": after,
        "shell.env": shell_env,
        "tool.definition": definition,
        "event": on_event,
        "permission.ask": permission_ask,
    }
