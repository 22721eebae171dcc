"""OpenCode's permission rules: last matching rule wins, no match means `ask`.

Also the built-in agents' default rulesets and the three refusal messages a model reads.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, get_args

from controlplane.core.calls.tool import ToolError
from controlplane.errors import ConfigError
from opencode_semantics.javascript import js_keys, json_stringify
from opencode_semantics.wildcard import match

Action: TypeAlias = Literal["allow", "deny", "ask"]
ACTIONS: tuple[Action, ...] = ("allow", "deny", "ask")


@dataclass(frozen=True)
class Rule:
    permission: str
    pattern: str
    action: Action
    bare: bool = field(default=False, compare=False, repr=False)
    """Made from a bare action (`"bash": "deny"`). Upstream's config code builds that object with `action`
    before `pattern`, but a session's ask parses its ruleset with the rule schema first, so the denied
    message always lists `permission, pattern, action`; only upstream's debug command shows the other order."""

    def to_json(self) -> dict[str, str]:
        return {"permission": self.permission, "pattern": self.pattern, "action": self.action}


Ruleset: TypeAlias = list[Rule]

EDIT_TOOLS = frozenset({"edit", "write", "patch", "multiedit", "apply_patch"})
"""Tools governed by the `edit` permission. `apply_patch` is missing upstream in v1.2.27 (fixed
right after); including it is an intentional divergence."""


def merge(*rulesets: Iterable[Rule]) -> Ruleset:
    return [rule for ruleset in rulesets for rule in ruleset]


def evaluate(permission: str, pattern: str, *rulesets: Iterable[Rule]) -> Rule:
    """The last rule matching both names, else `ask` (no specificity ordering, by design)."""
    found: Rule | None = None
    for rule in merge(*rulesets):
        if match(permission, rule.permission) and match(pattern, rule.pattern):
            found = rule
    return found if found is not None else Rule(permission, "*", "ask")


STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}


def strictest(permission: str, *rulesets: Iterable[Rule]) -> Rule:
    """The strictest rule that decides some pattern of `permission`: for a bash command whose name is
    known only when it runs, no pattern can be matched, so any rule that could apply to it does.

    Rules before the last one that matches every pattern (`"*"`) can decide nothing and are left out; with
    no such rule, no match at all is possible, so the default `ask` counts too.
    """
    found: Rule | None = None
    for rule in reversed(merge(*rulesets)):
        if not match(permission, rule.permission):
            continue
        if found is None or STRICTNESS[rule.action] > STRICTNESS[found.action]:
            found = rule
        if is_catch_all(rule.pattern):
            return found
    default = Rule(permission, "*", "ask")
    return default if found is None or STRICTNESS[found.action] < STRICTNESS["ask"] else found


def is_catch_all(pattern: str) -> bool:
    """A pattern every text matches."""
    return bool(pattern) and pattern.strip("*") == ""


def disabled(tool_ids: Iterable[str], ruleset: Iterable[Rule]) -> set[str]:
    """Tools to hide from the model: the last rule for the tool's permission is a blanket deny."""
    rules = list(ruleset)
    result: set[str] = set()
    for tool in tool_ids:
        permission = "edit" if tool in EDIT_TOOLS else tool
        last = next((r for r in reversed(rules) if match(permission, r.permission)), None)
        if last is not None and last.pattern == "*" and last.action == "deny":
            result.add(tool)
    return result


def disabled_layered(tool_ids: Iterable[str], ruleset: Iterable[Rule], policy: Iterable[Rule]) -> set[str]:
    """`disabled` for agent rules with operator rules after them.

    The operator's narrower rules must not un-hide a tool the agent denies outright: a tool is hidden
    when the combined rules blanket-deny it, or when the agent's do and no operator rule could allow
    or ask for its permission.
    """
    tools, rules, operator = list(tool_ids), list(ruleset), list(policy)
    hidden = disabled(tools, merge(rules, operator))
    for tool in disabled(tools, rules):
        name = "edit" if tool in EDIT_TOOLS else tool
        if not any(match(name, r.permission) and r.action != "deny" for r in operator):
            hidden.add(tool)
    return hidden


# --- configuration -------------------------------------------------------------------------------

def expand_home(pattern: str, home: str) -> str:
    # A `$HOME` prefix is replaced even when more letters follow (`$HOMEX` → `<home>X`), as upstream.
    if pattern.startswith("~/"):
        return home + pattern[1:]
    if pattern == "~":
        return home
    if pattern.startswith("$HOME"):
        return home + pattern[5:]
    return pattern


ACTION_ONLY_KEYS = frozenset({"todowrite", "todoread", "question", "webfetch", "websearch", "codesearch", "doom_loop"})
"""Permission keys upstream's config schema types as a bare action: an object of patterns there is invalid."""


def from_config(cfg: Mapping[str, Any] | str, *, home: str, action_only: frozenset[str] = ACTION_ONLY_KEYS) -> Ruleset:
    """Rules from a config `permission` value, in (JavaScript) key order, with `~`/`$HOME` expanded.

    Keys in `action_only` take a bare action, as upstream's schema types them (operator policy passes
    none, so an operator may deny `webfetch` for some URLs only).
    """
    if isinstance(cfg, str):
        cfg = {"*": cfg}
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"permission must be an action or an object, not {type(cfg).__name__}")
    rules: Ruleset = []
    for key in js_keys(cfg):
        value = cfg[key]
        if isinstance(value, str):
            rules.append(Rule(key, "*", _action(key, value), bare=True))
        elif isinstance(value, Mapping) and key not in action_only:
            rules += [
                Rule(key, expand_home(pattern, home), _action(f"{key}.{pattern}", value[pattern]))
                for pattern in js_keys(value)
            ]
        elif isinstance(value, Mapping):
            raise ConfigError(f"permission.{key} must be one of allow, deny, ask (it takes no patterns)")
        else:
            raise ConfigError(f"permission.{key} must be an action or an object of patterns")
    return rules


def _action(where: str, value: object) -> Action:
    if value not in ACTIONS:
        raise ConfigError(f"permission.{where}: expected one of allow, deny, ask; got {value!r}")
    return value


# --- refusals ------------------------------------------------------------------------------------

REJECTED_MESSAGE = "The user rejected permission to use this specific tool call."


def corrected_message(feedback: str) -> str:
    return f"The user rejected permission to use this specific tool call with the following feedback: {feedback}"


def relevant_rules(permission: str, rules: Iterable[Rule]) -> Ruleset:
    """The rules a denied message lists: those whose permission matches the request's, as upstream's ask does."""
    return [rule for rule in rules if match(permission, rule.permission)]


def denied_message(rules: Iterable[Rule]) -> str:
    """`rules`: what the model is shown (see `relevant_rules`), in evaluation order."""
    return (
        "The user has specified a rule which prevents you from using this specific tool call. "
        f"Here are some of the relevant rules {json_stringify([r.to_json() for r in rules])}"
    )


class RejectedError(ToolError):
    """The user refused without feedback; the session loop stops."""

    def __init__(self) -> None:
        super().__init__(REJECTED_MESSAGE)


class CorrectedError(ToolError):
    """The user refused with feedback; the model reads it and goes on."""

    def __init__(self, feedback: str) -> None:
        super().__init__(corrected_message(feedback))
        self.feedback = feedback


class DeniedError(ToolError):
    """A configured rule denies the call."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        super().__init__(denied_message(self.rules))


# --- agents --------------------------------------------------------------------------------------

AgentMode: TypeAlias = Literal["primary", "subagent", "all"]
AGENT_MODES: tuple[AgentMode, ...] = get_args(AgentMode)


@dataclass
class Agent:
    name: str
    mode: AgentMode
    permission: Ruleset
    description: str | None = None
    hidden: bool = False
    native: bool = True
    ceiling: Ruleset | None = field(default=None, compare=False)
    """The rules this agent has without the workspace's config layers, when they differ from
    `permission`: a decision is the stricter of the two (controlplane.core.permissions.rule_layers)."""


_DESCRIPTIONS = {
    "build": "The default agent. Executes tools based on configured permissions.",
    "plan": "Plan mode. Disallows all edit tools.",
    "general": "General-purpose agent for researching complex questions and executing multi-step tasks. "
    "Use this agent to execute multiple units of work in parallel.",
    "explore": 'Fast agent specialized for exploring codebases. Use this when you need to quickly find files by '
    'patterns (eg. "src/components/**/*.tsx"), search code for keywords (eg. "API endpoints"), or answer questions '
    'about the codebase (eg. "how do API endpoints work?"). When calling this agent, specify the desired '
    'thoroughness level: "quick" for basic searches, "medium" for moderate exploration, or "very thorough" for '
    "comprehensive analysis across multiple locations and naming conventions.",
}
_MODES: dict[str, AgentMode] = {
    "build": "primary", "plan": "primary", "general": "subagent", "explore": "subagent",
    "compaction": "primary", "title": "primary", "summary": "primary",
}
HIDDEN_AGENTS = frozenset({"compaction", "title", "summary"})


def tool_output_glob(tool_output_dir: str) -> str:
    return posixpath.join(tool_output_dir, "*")


def _base_rulesets(
    tool_output_dir: str, skill_dirs: list[str], data_dir_plans: str, user: Ruleset, worktree: str,
) -> tuple[Ruleset, dict[str, Ruleset]]:
    """(defaults, per-agent rulesets) before agent config and the final tool-output allowance."""

    def rules(cfg: Mapping[str, Any]) -> Ruleset:
        return from_config(cfg, home="")  # built-in patterns never start with ~ or $HOME

    external = {"*": "ask", tool_output_glob(tool_output_dir): "allow"}
    external.update({posixpath.join(d, "*"): "allow" for d in skill_dirs})
    defaults = rules({
        "*": "allow",
        "doom_loop": "ask",
        "external_directory": external,
        "question": "deny",
        "plan_enter": "deny",
        "plan_exit": "deny",
        # .env files may hold secrets: reading one asks, except the conventional example file.
        "read": {"*": "allow", "*.env": "ask", "*.env.*": "ask", "*.env.example": "allow"},
    })
    plans_md = posixpath.relpath(posixpath.join(data_dir_plans, "*.md"), worktree)
    specific = {
        "build": rules({"question": "allow", "plan_enter": "allow"}),
        "plan": rules({
            "question": "allow",
            "plan_exit": "allow",
            "external_directory": {posixpath.join(data_dir_plans, "*"): "allow"},
            "edit": {"*": "deny", ".opencode/plans/*.md": "allow", plans_md: "allow"},
        }),
        "general": rules({"todoread": "deny", "todowrite": "deny"}),
        "explore": rules({
            "*": "deny",
            **dict.fromkeys(("grep", "glob", "list", "bash", "webfetch", "websearch", "codesearch", "read"), "allow"),
            "external_directory": external,
        }),
        **{name: rules({"*": "deny"}) for name in ("compaction", "title", "summary")},
    }
    return defaults, {name: merge(defaults, ruleset, user) for name, ruleset in specific.items()}


def _allow_tool_output(ruleset: Ruleset, tool_output_dir: str) -> Ruleset:
    """Every agent may read saved tool outputs unless it denies exactly that glob."""
    glob = tool_output_glob(tool_output_dir)
    if any(r.permission == "external_directory" and r.action == "deny" and r.pattern == glob for r in ruleset):
        return ruleset
    return merge(ruleset, [Rule("external_directory", glob, "allow")])


def _given(cfg: Mapping[str, Any], key: str, current: Any) -> Any:
    """`cfg[key] ?? current`: an explicit null keeps the current value."""
    value = cfg.get(key)
    return current if value is None else value


def default_agent_rulesets(
    tool_output_dir: str, skill_dirs: list[str], data_dir_plans: str, user: Ruleset, *, worktree: str = "/",
) -> dict[str, Ruleset]:
    """Rulesets of build, plan, general, explore, compaction, title and summary.

    `data_dir_plans` is `<data dir>/plans`; the plan agent may edit `*.md` there, named relative to
    `worktree` as upstream does.
    """
    _, base = _base_rulesets(tool_output_dir, skill_dirs, data_dir_plans, user, worktree)
    return {name: _allow_tool_output(ruleset, tool_output_dir) for name, ruleset in base.items()}


def builtin_agents(
    tool_output_dir: str,
    skill_dirs: list[str],
    data_dir_plans: str,
    user: Ruleset,
    *,
    home: str,
    worktree: str = "/",
    agent_config: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Agent]:
    """The built-in agents, then config `agent.{name}` applied (disable, mode, description, hidden,
    permission), with unknown names creating custom agents from defaults + user rules."""
    defaults, base = _base_rulesets(tool_output_dir, skill_dirs, data_dir_plans, user, worktree)
    agents = {
        name: Agent(name, _MODES[name], ruleset, _DESCRIPTIONS.get(name), hidden=name in HIDDEN_AGENTS)
        for name, ruleset in base.items()
    }
    for name in js_keys(agent_config or {}):
        cfg = (agent_config or {})[name]
        if cfg.get("disable"):
            agents.pop(name, None)
            continue
        agent = agents.get(name)
        if agent is None:
            agent = agents[name] = Agent(name, "all", merge(defaults, user), native=False)
        agent.mode = _given(cfg, "mode", agent.mode)
        if agent.mode not in AGENT_MODES:
            raise ConfigError(f"agent.{name}.mode must be primary, subagent or all, not {agent.mode!r}")
        agent.description = _given(cfg, "description", agent.description)
        agent.hidden = _given(cfg, "hidden", agent.hidden)
        agent.permission = merge(agent.permission, from_config(_given(cfg, "permission", {}), home=home))
    for agent in agents.values():
        agent.permission = _allow_tool_output(agent.permission, tool_output_dir)
    return agents
