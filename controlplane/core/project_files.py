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
import posixpath
import re
from collections.abc import Mapping
from typing import Any

import pyjson5

from controlplane.core.agent_markdown import JsDate, js_key, parse_agent
from controlplane.core.project_config import with_legacy_tools
from controlplane.errors import ConfigError, InvalidArgumentError

MAX_FILE_BYTES = 1 << 20
"""A project config file or agent file larger than this is refused, not read."""

CONFIG_FILES = ("opencode.jsonc", "opencode.json", ".opencode/opencode.jsonc", ".opencode/opencode.json")
_AGENT_FILE = re.compile(r"\.opencode/agents?/(?P<name>.+)\.md")
_MODE_FILE = re.compile(r"\.opencode/modes?/(?P<name>[^/]+)\.md")
_JOINED_LISTS = ("plugin", "instructions")
_NO_STEPS = object()
_ENV_REFERENCE = re.compile(r"\{env:[^}]+\}")
_FILE_REFERENCE = re.compile(r"\{file:(?P<path>[^}]+)\}")
_MODES = ("primary", "subagent", "all")
_ACTIONS = ("allow", "deny", "ask")


def wanted(path: str) -> bool:
    """Whether a workspace path (relative, `/`-separated) is part of the project's config."""
    return path in CONFIG_FILES or bool(_AGENT_FILE.fullmatch(path) or _MODE_FILE.fullmatch(path))


def session_config(files: Mapping[str, bytes], config_json: str) -> str:
    """The session's opencode.json: the archive's project config (`files`, by workspace path) under the
    caller's `config_json` (JSONC accepted). Empty when there is neither. InvalidArgumentError names the
    file that cannot be used."""
    layers = [_config_file(path, files) for path in CONFIG_FILES if path in files]
    agents = _markdown_agents(files, _AGENT_FILE, primary=False)
    modes = _markdown_agents(files, _MODE_FILE, primary=True)
    layers += [{"agent": found} for found in (agents, modes) if found]
    if config_json:
        layers.append(_checked("config_json", _document("config_json", config_json)))
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


def _config_file(path: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    where = f"workspace {path}"
    text = _substituted(where, path, _text(path, files[path]), files)
    layer = _checked(where, _document(where, text))
    plugins = layer.get("plugin")
    if isinstance(plugins, list) and path.startswith(".opencode/"):
        # Upstream resolves a relative plugin path from the file that lists it; the sandbox, from the workspace.
        layer["plugin"] = [_from_workspace(".opencode", spec) for spec in plugins]
    return layer


def file_references(files: Mapping[str, bytes]) -> set[str]:
    """Workspace paths the config files name in `{file:...}`, which session_config needs in `files` too."""
    found: set[str] = set()
    for path in CONFIG_FILES:
        if path in files:
            for reference in _FILE_REFERENCE.finditer(_active(_text(path, files[path]))):
                target = _reference_path(path, reference["path"])
                if target is not None:
                    found.add(target)
    return found


def _substituted(where: str, path: str, text: str, files: Mapping[str, bytes]) -> str:
    """`{env:NAME}` and `{file:path}` replaced as upstream replaces them in a config file's text.

    A session has no environment of its own and the control plane's is not the tenant's, so every
    variable reads as unset: upstream's empty string. A file is read from the archive, relative to the
    config file; one outside the workspace or not in the archive fails as upstream's missing file does.
    References on a line that is only a `//` comment are skipped, as upstream skips them.
    """
    text = _ENV_REFERENCE.sub("", text)

    def content(match: re.Match[str]) -> str:
        target = _reference_path(path, match["path"])
        data = files.get(target) if target is not None else None
        if data is None:
            where_to = f"{target} is not in the workspace archive" if target else "it is outside the workspace"
            raise InvalidArgumentError(f'{where}: bad file reference: "{match[0]}": {where_to}')
        return json.dumps(_text(target or "", data).strip(), ensure_ascii=False)[1:-1]

    return "\n".join(
        line if line.lstrip().startswith("//") else _FILE_REFERENCE.sub(content, line) for line in text.split("\n")
    )


def _active(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith("//"))


def _reference_path(config_path: str, reference: str) -> str | None:
    """The workspace path a `{file:...}` of `config_path` names, or None outside the workspace."""
    if reference.startswith(("/", "~")):
        return None
    return _within_workspace(posixpath.join(posixpath.dirname(config_path), reference))


def _within_workspace(path: str) -> str | None:
    normal = posixpath.normpath(path)
    return None if normal.startswith("../") or normal in ("..", ".") else normal


def _from_workspace(config_dir: str, spec: Any) -> Any:
    if not isinstance(spec, str) or not spec.startswith(("./", "../")):
        return spec
    target = _within_workspace(posixpath.join(config_dir, spec))
    return spec if target is None else "./" + target


def _document(where: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        try:
            value = pyjson5.loads(text)  # comments and trailing commas
        except (pyjson5.Json5Exception, ValueError) as exc:
            raise InvalidArgumentError(f"{where} is not valid JSON: {exc.args[0] if exc.args else exc}") from None
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
        try:
            data, prompt = parse_agent(_text(path, files[path]))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"workspace {path}: {exc}") from None
        config: dict[str, Any] = {"name": match["name"], **data, "prompt": prompt}
        _check_agent(f"workspace {path}", config)
        if primary:
            config["mode"] = "primary"
        # Upstream's schema gives a markdown agent `steps` (its `steps` or `maxSteps`) even when it has
        # neither, and merging that undefined removes the steps a config file gave the agent.
        steps = config.get("steps", config.get("maxSteps"))
        config["steps"] = _NO_STEPS if steps is None else steps
        agents[js_key(config["name"])] = config
    return agents


def _check_agent(where: str, config: Mapping[str, Any]) -> None:
    """The settings upstream's agent schema types, refused as it refuses them."""
    def fail(key: str, what: str) -> None:
        raise InvalidArgumentError(f"{where}: `{key}` must be {what}, not {json.dumps(config[key], default=str)}")

    for key in ("model", "variant", "prompt", "description", "color"):
        if key in config and (not isinstance(config[key], str) or isinstance(config[key], JsDate)):
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


def _checked(where: str, layer: dict[str, Any]) -> dict[str, Any]:
    """The layer, once the values upstream's schema would refuse are known not to be in it."""
    for key in _JOINED_LISTS:
        if key in layer and not (isinstance(layer[key], list) and all(isinstance(v, str) for v in layer[key])):
            raise InvalidArgumentError(f"{where}: `{key}` must be a list of strings, not {json.dumps(layer[key])}")
    for section in ("agent", "mode"):
        agents = layer.get(section)
        if section in layer and not isinstance(agents, dict):
            raise InvalidArgumentError(f"{where}: `{section}` must be an object of agent settings")
        for name, config in (agents or {}).items():
            if not isinstance(config, dict):
                raise InvalidArgumentError(f"{where}: `{section}.{name}` must be an object of agent settings")
            _check_agent(f"{where}: {section}.{name}", config)
    return layer


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


def _merge_layer(target: dict[str, Any], source: dict[str, Any], top: bool = True) -> dict[str, Any]:
    """`source` merged over `target` key by key (objects deeply, anything else replaced)."""
    merged = dict(target)
    for key, value in source.items():
        current = merged.get(key)
        if value is _NO_STEPS:
            merged.pop(key, None)
        elif top and key in _JOINED_LISTS and isinstance(value, list) and isinstance(current, list):
            # Repeats go, the first kept; of two plugins of one name, the sandbox then loads the later.
            merged[key] = list(dict.fromkeys([*current, *value]))
        elif isinstance(value, dict):
            merged[key] = _merge_layer(current if isinstance(current, dict) else {}, value, top=False)
        else:
            merged[key] = value
    return merged
