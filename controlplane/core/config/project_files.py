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

from controlplane.core.config.agent_markdown import ExpansionBudget, JsDate, js_key, parse_agent
from controlplane.core.config.config_text import (
    MAX_CONFIG_CHARS,
    cut,
    decoded,
    document,
    is_utf8,
    shown,
    substituted,
    within_workspace,
)
from controlplane.core.config.config_text import MAX_FILE_BYTES as MAX_FILE_BYTES
from controlplane.core.config.config_text import file_references as references_in
from controlplane.core.config.project_config import agent_configs, with_legacy_tools
from controlplane.core.permissions.permission import AGENT_MODES, builtin_agents
from controlplane.errors import ConfigError, InvalidArgumentError

MAX_PROJECT_BYTES = 8 << 20
"""All project config files of one archive together (each at most MAX_FILE_BYTES)."""

CONFIG_FILES = ("opencode.jsonc", "opencode.json", ".opencode/opencode.jsonc", ".opencode/opencode.json")
_AGENT_FILE = re.compile(r"\.opencode/agents?/(?P<name>.+)\.md")
_MODE_FILE = re.compile(r"\.opencode/modes?/(?P<name>[^/]+)\.md")
_JOINED_LISTS = ("plugin", "instructions")
_NO_STEPS = object()
_ACTIONS = ("allow", "deny", "ask")


def wanted(path: str) -> bool:
    """Whether a workspace path (relative, `/`-separated) is part of the project's config."""
    return path in CONFIG_FILES or bool(_AGENT_FILE.fullmatch(path) or _MODE_FILE.fullmatch(path))


def session_config(files: Mapping[str, bytes], config_json: str) -> str:
    """The session's opencode.json: the archive's project config (`files`, by workspace path) under the
    caller's `config_json` (JSONC accepted). Empty when there is neither. InvalidArgumentError names the
    file that cannot be used."""
    for path in files:
        if not path.isprintable() or not is_utf8(path):
            raise InvalidArgumentError(f"workspace {shown(path)}: a project config file's name must be printable UTF-8")
    layers = [_config_file(path, files) for path in CONFIG_FILES if path in files]
    budget = ExpansionBudget(MAX_CONFIG_CHARS)
    agents = _markdown_agents(files, _AGENT_FILE, budget, primary=False)
    modes = _markdown_agents(files, _MODE_FILE, budget, primary=True)
    layers += [{"agent": found} for found in (agents, modes) if found]
    if config_json:
        layers.append(_checked("config_json", document("config_json", config_json)))
    if not layers:
        return ""
    if len(layers) == 1 and not files and _strict_json(config_json):
        return config_json
    merged: dict[str, Any] = {}
    for layer in layers:
        merged = _merge_layer(merged, _tools_as_permission(layer))
    text = json.dumps(merged, ensure_ascii=False)
    if len(text) > MAX_CONFIG_CHARS:
        raise InvalidArgumentError(f"the session's config comes to {len(text)} characters; the limit is "
                                   f"{MAX_CONFIG_CHARS}")
    if not is_utf8(text):
        raise InvalidArgumentError("the session's config holds an unpaired surrogate (a \\ud800-\\udfff escape)")
    return text


def session_and_caller_config(files: Mapping[str, bytes], config_json: str) -> tuple[str, str | None]:
    """The session's config (session_config) and, when the project's files added to it, the caller's own
    config without them, kept apart because the workspace may narrow the caller's rules but never widen
    them (controlplane.core.permissions.rule_layers); None when the session's config is the caller's alone."""
    merged = session_config(files, config_json)
    if not files:
        return merged, None
    caller = session_config({}, config_json)
    return merged, None if caller == merged else caller


def default_agent(config_text: str) -> str:
    """The agent a session runs as when its creator names none, as upstream picks it: the config's
    `default_agent` (a primary agent that is not hidden), else the first such agent (`build`, unless the
    config disables it)."""
    if not config_text:
        return "build"
    config = json.loads(config_text)
    agents = builtin_agents("/tool-output", [], "/plans", [], home="/", agent_config=agent_configs(config))
    chosen = config.get("default_agent")
    if chosen is not None:
        agent = agents.get(chosen) if isinstance(chosen, str) else None
        if agent is None or agent.mode == "subagent" or agent.hidden:
            problem = "not an agent" if agent is None else "a subagent" if agent.mode == "subagent" else "hidden"
            raise InvalidArgumentError(f"the config's default_agent {shown(chosen)} is {problem}; name the session's "
                                       "agent in CreateSession's agent instead (an agent a plugin adds counts there)")
        return agent.name
    for agent in agents.values():
        if agent.mode != "subagent" and not agent.hidden:
            return agent.name
    raise InvalidArgumentError("the config leaves no primary agent to run the session as (build and plan are "
                               "disabled); name one in CreateSession's agent (an agent a plugin adds counts there)")


def workspace_chosen_agent(agent: str, caller_config_text: str | None) -> None:
    """Refuses a session agent the workspace chose over one the caller's own config has settings for.

    With no agent named at create, the workspace's config can change which agent the session runs as
    (its `default_agent`, or disabling `build`). The chosen agent's rules are capped by the caller's config
    for that agent's name only, so a caller who confined `build` (`agent.build.permission`) would otherwise
    see the session run as an agent the caller never configured: the workspace must not widen that way.
    """
    if caller_config_text is None:
        return  # the workspace added nothing
    caller = json.loads(caller_config_text) if caller_config_text else {}
    try:
        caller_agent = default_agent(caller_config_text)
    except InvalidArgumentError:
        return  # the caller's own default_agent names an agent the workspace defines: the caller chose it
    configured = agent_configs(caller) if isinstance(caller, dict) else {}
    if agent == caller_agent or caller_agent not in configured or agent in configured:
        return
    raise InvalidArgumentError(
        f"the workspace's config makes {shown(agent)} the session's agent, while config_json's settings are for "
        f"{shown(caller_agent)}; name the session's agent in CreateSession's agent")


def file_references(files: Mapping[str, bytes]) -> set[str]:
    """Workspace paths the config files name in `{file:...}`, which session_config needs in `files` too."""
    found: set[str] = set()
    for path in CONFIG_FILES:
        if path in files:
            found |= references_in(path, decoded(path, files[path]))
    return found


def _strict_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _config_file(path: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    where = f"workspace {path}"
    layer = _checked(where, document(where, substituted(where, path, decoded(path, files[path]), files)))
    plugins = layer.get("plugin")
    if isinstance(plugins, list) and path.startswith(".opencode/"):
        # Upstream resolves a relative plugin path from the file that lists it; the sandbox, from the workspace.
        layer["plugin"] = [_from_workspace(".opencode", spec) for spec in plugins]
    return layer


def _from_workspace(config_dir: str, spec: Any) -> Any:
    if not isinstance(spec, str) or not spec.startswith(("./", "../")):
        return spec
    target = within_workspace(posixpath.join(config_dir, spec))
    return spec if target is None else "./" + target


def _markdown_agents(
    files: Mapping[str, bytes], pattern: re.Pattern[str], budget: ExpansionBudget, *, primary: bool,
) -> dict[str, Any]:
    """Agent configs by name, from the files `pattern` matches, in path order (a later one of the same
    name replaces an earlier one)."""
    agents: dict[str, Any] = {}
    for path in sorted(files):
        match = pattern.fullmatch(path)
        if match is None:
            continue
        try:
            data, prompt = parse_agent(decoded(path, files[path]), budget)
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
        raise InvalidArgumentError(f"{where}: `{key}` must be {what}, not {shown(config[key])}")

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
    if "mode" in config and config["mode"] not in AGENT_MODES:
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
            raise InvalidArgumentError(f"{where}: `{key}` must be a list of strings, not {shown(layer[key])}")
    for section in ("agent", "mode"):
        agents = layer.get(section)
        if section in layer and not isinstance(agents, dict):
            raise InvalidArgumentError(f"{where}: `{section}` must be an object of agent settings")
        for name, config in (agents or {}).items():
            if not isinstance(config, dict):
                raise InvalidArgumentError(f"{where}: `{section}.{cut(name)}` must be an object of agent settings")
            _check_agent(f"{where}: {section}.{cut(name)}", config)
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
