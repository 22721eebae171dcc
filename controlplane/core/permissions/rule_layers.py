"""The workspace narrows the caller's rules, never widens them.

Upstream merges permissions low to high: defaults, the top-level user permission, then the agent's own.
Here the user permission is assembled from two parties: the workspace archive (its `opencode.json(c)`,
`.opencode/agent(s)/**/*.md`, `.opencode/mode(s)/*.md`) and, over it, the API caller's `config_json`.
The workspace is the untrusted one (a prompt-injected model can have shipped or shaped it), so an agent
it defines, or an agent section it overrides, must not allow what the caller's rules ask for or deny.

The rule: each agent keeps upstream's merged ruleset (`Agent.permission`, what the oracle compares), and
gets a `ceiling`: the ruleset the same agent name has when the workspace's layers are left out (the
caller's config alone; for an agent only the workspace defines, what a custom agent gets from the
defaults and the caller's top level). A permission's decision is the stricter (deny > ask > allow) of the
two. The merged ruleset keeps every narrowing the workspace makes, the ceiling every rule of the caller's;
the operator's rules come after both (asks.py), so they still have the last word.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.core.calls.subtasks import child_session_rules, hidden_in_child, primary_tools
from controlplane.core.config import project_config, project_files
from controlplane.core.permissions import permission
from controlplane.core.permissions.permission import STRICTNESS, Agent, Rule, Ruleset, disabled_layered, evaluate
from controlplane.errors import InvalidArgumentError

CEILING_SOURCE = "caller"
"""How the audit names a rule that decided from the ceiling (the caller's own rules)."""


def stricter(first: Rule, second: Rule) -> Rule:
    """The rule whose action is stricter; `first` when they are equally strict."""
    return second if STRICTNESS[second.action] > STRICTNESS[first.action] else first


def decide(permission: str, pattern: str, agent: Agent, *after: Iterable[Rule]) -> Rule:
    """The deciding rule for an agent's ask (`after`: rules evaluated after the agent's, e.g. approvals)."""
    rules = [list(r) for r in after]
    found = evaluate(permission, pattern, agent.permission, *rules)
    if agent.ceiling is None:
        return found
    return stricter(found, evaluate(permission, pattern, agent.ceiling, *rules))


def hidden_tools(tool_ids: Iterable[str], ruleset: Ruleset, ceiling: Ruleset | None, policy: Ruleset) -> set[str]:
    """Tools to hide from the model's list: those the merged rules or the ceiling deny outright."""
    tools = list(tool_ids)
    hidden = disabled_layered(tools, ruleset, policy)
    if ceiling is not None:
        hidden |= disabled_layered(tools, ceiling, policy)
    return hidden


def with_ceilings(
    agents: dict[str, Agent], baseline: Callable[[Iterable[str]], Mapping[str, Agent]],
) -> dict[str, Agent]:
    """`agents` (built from the session's whole config), each given its ceiling from `baseline`.

    `baseline(extra_names)` builds the agents from the caller's config alone, with each of `extra_names`
    (agents only the workspace defines) added as a bare custom agent. An agent the caller's config has
    no counterpart for at all (it disabled that name) gets a ceiling that denies everything.
    """
    base = baseline(list(agents))
    for name, agent in agents.items():
        counterpart = base.get(name)
        ceiling = counterpart.permission if counterpart is not None else [Rule("*", "*", "deny")]
        # Identical rules cannot widen anything: no second evaluation on every ask.
        agent.ceiling = None if ceiling == agent.permission else ceiling
    return agents


@dataclass(frozen=True)
class AgentSetting:
    """Where a session's agents live in its sandbox (paths their built-in rules name)."""

    tool_output_dir: str
    plans_dir: str
    home: str
    skill_dirs: tuple[str, ...] = ()
    env_permission: str | None = None
    """The operator's OPENCODE_PERMISSION, part of every user permission."""
    worktree: str = "/"
    """The session's worktree: upstream writes the plan agent's plan-file rule relative to it."""


def agents_of(config: Mapping[str, Any], setting: AgentSetting, bare: Iterable[str] = ()) -> dict[str, Agent]:
    """The agents a config defines; each name of `bare` it does not configure is added as a custom agent
    (for the ceiling of an agent the caller's config lacks) with the permission the config gives its
    default agent: an agent only the workspace defines, reached through `task`, can never do more than
    the caller let the session's own agent do (a caller that confined `build` confined the session)."""
    user = permission.from_config(project_config.user_permission(config, setting.env_permission), home=setting.home)
    sections = project_config.agent_configs(config)
    confined = sections.get(_default_name(config), {}).get("permission")
    inherited = {} if confined is None else {"permission": confined}
    sections |= {name: dict(inherited) for name in bare if name not in sections}
    return permission.builtin_agents(
        setting.tool_output_dir, list(setting.skill_dirs), setting.plans_dir, user, agent_config=sections,
        home=setting.home, worktree=setting.worktree,
    )


def _default_name(config: Mapping[str, Any]) -> str:
    """The agent a session of this config runs as when none is named (project_files.default_agent); build
    when the config names a default only a plugin or the workspace defines."""
    try:
        return project_files.default_agent(json.dumps(config))
    except InvalidArgumentError:
        return "build"


def session_agents(
    config: Mapping[str, Any], caller: Mapping[str, Any] | None, setting: AgentSetting,
) -> dict[str, Agent]:
    """A session's agents from its whole config, each with its ceiling from the caller's own config
    (`caller`; None when the session's config is the caller's alone)."""
    agents = agents_of(config, setting)
    if caller is None:
        return agents
    return with_ceilings(agents, lambda names: agents_of(caller, setting, names))


def session_rules(
    agent: Agent, config: Mapping[str, Any], caller: Mapping[str, Any] | None, *, child: bool,
) -> tuple[Ruleset, Ruleset | None, set[str]]:
    """The rules calls of `agent` obey in a session, their ceiling (None when it changes nothing), and the
    tools switched off for it.

    A child session (made by `task`) adds upstream's subagent session rules after the agent's; the
    ceiling's are made from the caller's config alone, since `experimental.primary_tools` allows tools in
    children and an agent's mention of `task` lets children start grandchildren.
    """
    if not child:
        return agent.permission, agent.ceiling, set()
    primary = primary_tools(config)
    ruleset = permission.merge(agent.permission, child_session_rules(agent, primary))
    hidden = hidden_in_child(agent, primary)
    if caller is None and agent.ceiling is None:
        return ruleset, None, hidden
    own = Agent(agent.name, agent.mode, agent.ceiling if agent.ceiling is not None else agent.permission)
    caller_primary = primary_tools(caller if caller is not None else config)
    ceiling = permission.merge(own.permission, child_session_rules(own, caller_primary))
    return ruleset, None if ceiling == ruleset else ceiling, hidden | hidden_in_child(own, caller_primary)
