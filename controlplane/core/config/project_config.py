"""The parts of a session's `opencode.json` that shape permissions, as upstream reads them.

The deprecated `tools` map (`{name: bool}`) becomes permission rules, with `write`, `edit`, `patch`
and `multiedit` folded into `edit`; explicit `permission` entries win over it. `OPENCODE_PERMISSION`
(a JSON value) is deep-merged over the result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from controlplane.errors import ConfigError

LEGACY_EDIT_TOOLS = frozenset({"write", "edit", "patch", "multiedit"})


def merge_deep(target: Any, source: Any) -> Any:
    """Objects merge key by key (target's keys first); anything else is replaced by `source`."""
    if isinstance(target, Mapping) and isinstance(source, Mapping):
        merged = dict(target)
        for key, value in source.items():
            merged[key] = merge_deep(merged[key], value) if key in merged else value
        return merged
    return source


def _as_object(permission: Any) -> Any:
    return {"*": permission} if isinstance(permission, str) else permission


def legacy_tools_permission(tools: Mapping[str, Any], where: str = "tools") -> dict[str, str]:
    result: dict[str, str] = {}
    for name, enabled in tools.items():
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where}.{name} must be true or false, not {enabled!r}")
        result["edit" if name in LEGACY_EDIT_TOOLS else name] = "allow" if enabled else "deny"
    return result


def with_legacy_tools(section: Mapping[str, Any], where: str) -> Any:
    """`section.permission`, with `section.tools` migrated under it."""
    permission = section.get("permission")
    tools = section.get("tools")
    if tools is None:
        return permission
    if not isinstance(tools, Mapping):
        raise ConfigError(f"{where}.tools must be an object of booleans")
    migrated = legacy_tools_permission(tools, f"{where}.tools")
    if permission is None:
        return migrated
    return merge_deep(migrated, _as_object(permission))


def user_permission(config: Mapping[str, Any], env_permission: str | None = None) -> Any:
    """The project's permission value: config `permission` + legacy `tools` + OPENCODE_PERMISSION."""
    permission = with_legacy_tools(config, "opencode.json")
    if env_permission:
        try:
            override = json.loads(env_permission)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"OPENCODE_PERMISSION is not valid JSON: {exc}") from exc
        permission = merge_deep(_as_object(permission) if permission is not None else {}, _as_object(override))
    return permission if permission is not None else {}


def agent_configs(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`agent.{name}` sections, each with its legacy `tools` migrated into `permission`.

    The deprecated `mode.{name}` sections are primary agents merged over the `agent` ones, last of all,
    as upstream merges them.
    """
    agents = config.get("agent") or {}
    if not isinstance(agents, Mapping):
        raise ConfigError("opencode.json: agent must be an object of agent configs")
    modes = config.get("mode") or {}
    if not isinstance(modes, Mapping):
        raise ConfigError("opencode.json: mode must be an object of agent configs")
    for name, section in modes.items():
        if not isinstance(section, Mapping):
            raise ConfigError(f"opencode.json: mode.{name} must be an object")
        agents = merge_deep(agents, {name: {**section, "mode": "primary"}})
    result: dict[str, dict[str, Any]] = {}
    for name, section in agents.items():
        if not isinstance(section, Mapping):
            raise ConfigError(f"opencode.json: agent.{name} must be an object")
        migrated = dict(section)
        permission = with_legacy_tools(section, f"agent.{name}")
        if permission is not None:
            migrated["permission"] = permission
        result[name] = migrated
    return result
