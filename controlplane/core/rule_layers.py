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

from collections.abc import Callable, Iterable, Mapping

from controlplane.core.permission import Agent, Rule, Ruleset, disabled_layered, evaluate

STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
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
