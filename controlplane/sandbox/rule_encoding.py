"""A call's permission rules as ToolStart carries them to the sandbox agent."""

from __future__ import annotations

from controlplane.core.permissions.asks import LocalRules
from controlplane.core.permissions.permission import Rule
from sandbox.v1 import agent_pb2


def encode_rules(rules: LocalRules) -> agent_pb2.PermissionRules:
    """The rules, each with its source (agent, approved, operator: the agent leaves approvals out of the
    strictest rule), and their ceiling (the caller's own rules) when the workspace's config added to them."""

    def listed(entries: tuple[tuple[Rule, str], ...]) -> list[agent_pb2.PermissionRule]:
        return [agent_pb2.PermissionRule(permission=rule.permission, pattern=rule.pattern, action=rule.action,
                                         source=source)
                for rule, source in entries]

    encoded = agent_pb2.PermissionRules(rules=listed(rules.rules))
    if rules.ceiling is not None:
        encoded.ceiling.CopyFrom(agent_pb2.PermissionRules(rules=listed(rules.ceiling)))
    return encoded
