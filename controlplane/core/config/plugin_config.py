"""What the platform takes from the config the project plugins' `config` hooks leave.

Upstream runs those hooks on its live config, and a plugin may change anything. Here plugins are tenant
code in the sandbox, while the session's opencode.json comes from the API caller, so a hook may add agents
and local MCP servers (which run in the sandbox) and nothing else:

- the session's own settings are kept where a hook changed or removed them;
- `permission` and `tools`, top-level and of every agent, are the session's alone: sandboxed code does not
  get to allow what the caller's rules ask for or deny;
- a remote MCP server would make the control plane connect where the sandbox's code says, a way out of a
  sandbox that has no network, so a hook cannot add one;
- any other key a hook changes is not applied either.

What is not applied is reported, in ListTools' load errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from controlplane.core.config.project_config import merge_deep
from controlplane.core.permissions.permission import AGENT_MODES

ORIGIN = "opencode.json (plugin config hooks)"
ADOPTED = ("agent", "mcp")
RULE_KEYS = ("permission", "tools")
HOST_DEFAULTS: dict[str, Any] = {"agent": {}, "mode": {}, "plugin": []}
"""Keys the tool host gives the config before the hooks run, as upstream's loaded config has them."""


@lru_cache(maxsize=256)
def adopted_json(own_json: str, hooked_json: str) -> tuple[str, tuple[str, ...]]:
    """The session's config (JSON) with what the hooks may change; notes on what they changed but may not."""
    own = _object(own_json)
    hooked = _object(hooked_json)
    if hooked is None:
        return own_json, ("the config the hooks left is not a JSON object; the session's own is kept",)
    config, notes = adopt(own or {}, hooked)
    return json.dumps(config), tuple(notes)


def adopt(own: Mapping[str, Any], hooked: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    result = dict(own)
    for key in dict.fromkeys([*own, *hooked]):
        if key in ADOPTED:
            continue
        if key in own and hooked.get(key) != own[key]:
            notes.append(f"{key}: changed by a hook; the session's own is kept")
        elif key not in own and hooked.get(key, HOST_DEFAULTS.get(key)) != HOST_DEFAULTS.get(key):
            notes.append(f"{key}: added by a hook; not applied (a plugin may add agents and local MCP servers only)")
    agents = _agents(own.get("agent"), hooked.get("agent"), notes)
    if agents or "agent" in own:
        result["agent"] = agents
    servers = _servers(own.get("mcp"), hooked.get("mcp"), notes)
    if servers or "mcp" in own:
        result["mcp"] = servers
    return result, notes


def _agents(own: Any, hooked: Any, notes: list[str]) -> dict[str, Any]:
    own = own if isinstance(own, Mapping) else {}
    if not isinstance(hooked, Mapping):
        notes.append("agent: a hook left it not an object; the session's own is kept")
        return dict(own)
    result: dict[str, Any] = {}
    for name in dict.fromkeys([*hooked, *own]):
        section, mine = hooked.get(name), own.get(name)
        if not isinstance(section, Mapping):
            if name in own:
                result[name] = mine
                if name in hooked:
                    notes.append(f"agent.{name}: changed by a hook; the session's own is kept")
            else:
                notes.append(f"agent.{name}: not an object; not applied")
            continue
        mine = mine if isinstance(mine, Mapping) else {}
        for key in RULE_KEYS:
            if key in section and section.get(key) != mine.get(key):
                notes.append(f"agent.{name}.{key}: a hook cannot change an agent's rules; not applied")
        taken = _checked(name, {k: v for k, v in section.items() if k not in RULE_KEYS}, notes)
        merged = merge_deep(taken, {k: v for k, v in mine.items() if k not in RULE_KEYS})
        merged.update({k: mine[k] for k in RULE_KEYS if k in mine})
        result[name] = merged
    return result


def _checked(name: str, fields: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """An agent's fields from a hook, less those the platform would refuse (one bad field must not fail
    every call of the session)."""
    kept = {}
    for key, value in fields.items():
        expected = AGENT_FIELDS.get(key)
        if expected is not None and not expected[0](value):
            notes.append(f"agent.{name}.{key}: must be {expected[1]}; not applied")
            continue
        kept[key] = value
    return kept


AGENT_FIELDS: dict[str, tuple[Any, str]] = {
    "mode": (lambda v: v in AGENT_MODES, "primary, subagent or all"),
    "description": (lambda v: isinstance(v, str), "a string"),
    "hidden": (lambda v: isinstance(v, bool), "true or false"),
    "disable": (lambda v: isinstance(v, bool), "true or false"),
}
"""What the platform checks of an agent's settings (controlplane.core.permissions.permission.builtin_agents)."""


def _servers(own: Any, hooked: Any, notes: list[str]) -> dict[str, Any]:
    own = own if isinstance(own, Mapping) else {}
    if hooked is None:
        return dict(own)
    if not isinstance(hooked, Mapping):
        notes.append("mcp: a hook left it not an object; the session's own is kept")
        return dict(own)
    result: dict[str, Any] = {}
    for name in dict.fromkeys([*hooked, *own]):
        entry = hooked.get(name)
        if name in own:
            result[name] = own[name]
            if name in hooked and entry != own[name]:
                notes.append(f"mcp.{name}: changed by a hook; the session's own is kept")
        elif isinstance(entry, Mapping) and entry.get("type") == "local":
            result[name] = entry
        else:
            notes.append(f"mcp.{name}: only a local server (run in the sandbox) may be added by a hook; not applied")
    return result


def _object(text: str) -> dict[str, Any] | None:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
