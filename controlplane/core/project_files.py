"""The OpenCode project configuration a workspace archive carries, read once when its session is created.

Upstream builds a project's config from these layers, low to high: `opencode.jsonc` then `opencode.json`
at the project root, the same two in `.opencode/`, the markdown agents of `.opencode/{agent,agents}/**/*.md`
and the primary agents of `.opencode/{mode,modes}/*.md`, then OPENCODE_CONFIG_CONTENT, whose part the
session's `config_json` plays. Lists under `plugin` and `instructions` are joined without repeats; every
other value merges key by key. An agent's deprecated `tools` map becomes permission rules within its own
layer, before the layers merge, as upstream's schema converts each file.

The archive is read at create and never again: upstream reads its config once per instance, and here a
tool call that writes `.opencode/agent/x.md` must not be able to give an agent new permissions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import json5

from controlplane.core.agent_markdown import parse_agent
from controlplane.core.project_config import with_legacy_tools
from controlplane.errors import ConfigError, InvalidArgumentError

MAX_FILE_BYTES = 1 << 20
"""A project config file or agent file larger than this is refused, not read."""

CONFIG_FILES = ("opencode.jsonc", "opencode.json", ".opencode/opencode.jsonc", ".opencode/opencode.json")
_AGENT_FILE = re.compile(r"\.opencode/agents?/(?P<name>.+)\.md")
_MODE_FILE = re.compile(r"\.opencode/modes?/(?P<name>[^/]+)\.md")
_JOINED_LISTS = ("plugin", "instructions")
_MODES = ("primary", "subagent", "all")
_ACTIONS = ("allow", "deny", "ask")


def wanted(path: str) -> bool:
    """Whether a workspace path (relative, `/`-separated) is part of the project's config."""
    return path in CONFIG_FILES or bool(_AGENT_FILE.fullmatch(path) or _MODE_FILE.fullmatch(path))


def session_config(files: Mapping[str, bytes], config_json: str) -> str:
    """The session's opencode.json: the archive's project config (`files`, by workspace path) under the
    caller's `config_json` (JSONC accepted). Empty when there is neither. InvalidArgumentError names the
    file that cannot be used."""
    layers = [_config_file(path, files[path]) for path in CONFIG_FILES if path in files]
    agents = _markdown_agents(files, _AGENT_FILE, primary=False)
    modes = _markdown_agents(files, _MODE_FILE, primary=True)
    layers += [{"agent": found} for found in (agents, modes) if found]
    if config_json:
        layers.append(_document("config_json", config_json))
    if not layers:
        return ""
    if len(layers) == 1 and not files:
        return config_json if _strict_json(config_json) else json.dumps(layers[0], ensure_ascii=False)
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = _merge_layer(merged, _tools_as_permission(layer))
    return json.dumps(merged, ensure_ascii=False)


def _strict_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _config_file(path: str, data: bytes) -> dict[str, Any]:
    return _document(f"workspace {path}", _text(path, data))


def _document(where: str, text: str) -> dict[str, Any]:
    try:
        value = json5.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise InvalidArgumentError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where} must be a JSON object (an opencode.json document)")
    return value


def _text(path: str, data: bytes) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise InvalidArgumentError(f"workspace {path} is {len(data)} bytes; a project config file may have "
                                   f"at most {MAX_FILE_BYTES}")
    return data.decode("utf-8", "replace")


def _markdown_agents(files: Mapping[str, bytes], pattern: re.Pattern[str], *, primary: bool) -> dict[str, Any]:
    """Agent configs by name, from the files `pattern` matches, in path order (a later one of the same
    name replaces an earlier one)."""
    agents: dict[str, Any] = {}
    for path in sorted(files):
        match = pattern.fullmatch(path)
        if match is None:
            continue
        where = f"workspace {path}"
        data, prompt = parse_agent(where, _text(path, files[path]))
        config: dict[str, Any] = {"name": match["name"], **data, "prompt": prompt}
        _check_agent(where, config)
        if primary:
            config["mode"] = "primary"
        agents[config["name"]] = config
    return agents


def _check_agent(where: str, config: Mapping[str, Any]) -> None:
    """The settings upstream's agent schema types, refused as it refuses them."""
    def fail(key: str, what: str) -> None:
        raise InvalidArgumentError(f"{where}: `{key}` must be {what}, not {json.dumps(config[key])}")

    for key in ("name", "model", "variant", "prompt", "description", "color"):
        if key in config and not isinstance(config[key], str):
            fail(key, "a string")
    for key in ("temperature", "top_p"):
        if key in config and (isinstance(config[key], bool) or not isinstance(config[key], (int, float))):
            fail(key, "a number")
    for key in ("steps", "maxSteps"):
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            fail(key, "a positive integer")
    for key in ("disable", "hidden"):
        if key in config and not isinstance(config[key], bool):
            fail(key, "true or false")
    if "mode" in config and config["mode"] not in _MODES:
        fail("mode", "primary, subagent or all")
    tools = config.get("tools")
    if "tools" in config and not (isinstance(tools, dict) and all(isinstance(v, bool) for v in tools.values())):
        fail("tools", "an object of true/false values")
    if "permission" in config and not _is_permission(config["permission"]):
        fail("permission", "allow, deny, ask or an object of them (by tool, then by pattern)")


def _is_permission(value: Any) -> bool:
    if isinstance(value, str):
        return value in _ACTIONS
    if not isinstance(value, dict):
        return False
    return all(
        item in _ACTIONS if isinstance(item, str)
        else isinstance(item, dict) and all(action in _ACTIONS for action in item.values())
        for item in value.values()
    )


def _tools_as_permission(layer: dict[str, Any]) -> dict[str, Any]:
    agents = layer.get("agent")
    if not isinstance(agents, dict) or not any(isinstance(a, dict) and "tools" in a for a in agents.values()):
        return layer
    converted = {}
    for name, section in agents.items():
        if isinstance(section, dict) and "tools" in section:
            try:
                permission = with_legacy_tools(section, f"agent.{name}")
            except ConfigError as exc:
                raise InvalidArgumentError(str(exc)) from None
            section = {key: value for key, value in section.items() if key != "tools"} | {"permission": permission}
        converted[name] = section
    return {**layer, "agent": converted}


def _merge_layer(target: Any, source: Any, top: bool = True) -> Any:
    if not (isinstance(target, dict) and isinstance(source, dict)):
        return source
    merged = dict(target)
    for key, value in source.items():
        if top and key in _JOINED_LISTS and isinstance(value, list) and isinstance(merged.get(key), list):
            merged[key] = list(dict.fromkeys([*merged[key], *value], None)) if _hashable(merged[key], value) \
                else [*merged[key], *value]
        elif key in merged:
            merged[key] = _merge_layer(merged[key], value, top=False)
        else:
            merged[key] = value
    return merged


def _hashable(*lists: list[Any]) -> bool:
    return all(isinstance(item, (str, int, float, bool)) or item is None for items in lists for item in items)
