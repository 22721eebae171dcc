"""Asks the call's permission rules allow, settled in the agent without a round trip to the control plane.

The wildcard is the control plane's own (`opencode_semantics.wildcard`, shipped in the image), so both decide alike;
tests/unit/test_agent_permission_rules.py holds these rules to the control plane's evaluation of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from opencode_semantics.wildcard import match
from sandbox.v1 import agent_pb2

_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}


def _stricter(first: str, second: str) -> str:
    return second if _STRICTNESS[second] > _STRICTNESS[first] else first


class LocalRules:
    """The rules of one call; `allows` is True only when every pattern's last matching rule allows, in the
    rules and in their ceiling when there is one (the caller's own rules, which the workspace's config
    may narrow but never widen)."""

    def __init__(self, rules: Sequence[agent_pb2.PermissionRule], ceiling: LocalRules | None = None) -> None:
        # Newest first, so the first match is the deciding (last) rule.
        self._rules = [(r.permission, r.pattern, r.action) for r in reversed(rules)]
        self._ruleset = [(r.permission, r.pattern, r.action) for r in reversed(rules) if r.source != "approved"]
        """Without the session's approvals: the rules a command not known is decided by."""
        self._by_permission: dict[str, list[tuple[str, str]]] = {}
        self._ceiling = ceiling
        self._denies: dict[str, bool] = {}

    @classmethod
    def of(cls, message: agent_pb2.PermissionRules) -> LocalRules:
        ceiling = cls(message.ceiling.rules) if message.HasField("ceiling") else None
        return cls(message.rules, ceiling)

    def action(self, permission: str, pattern: str) -> str:
        """The decision for one pattern: the stricter of the rules' and their ceiling's (deny > ask > allow)."""
        own = self._own(permission, pattern)
        if self._ceiling is None or own == "deny":
            return own
        return _stricter(own, self._ceiling.action(permission, pattern))

    def _own(self, permission: str, pattern: str) -> str:
        for glob, action in self._for(permission):
            if match(pattern, glob):
                return action
        return "ask"

    def _for(self, permission: str) -> list[tuple[str, str]]:
        """(pattern, action) of the rules for `permission`, newest first: matched once per permission, since a
        bash ask brings a dozen texts (patterns and normalised forms)."""
        found = self._by_permission.get(permission)
        if found is None:
            found = self._by_permission[permission] = [(g, a) for name, g, a in self._rules if match(permission, name)]
        return found

    def may_deny(self, permission: str) -> bool:
        found = self._denies.get(permission)
        if found is None:
            found = self._denies[permission] = any(
                action == "deny" and match(permission, name) for name, _, action in self._rules
            ) or (self._ceiling is not None and self._ceiling.may_deny(permission))
        return found

    def allows(self, permission: str, patterns: Sequence[str], checks: Sequence[str] = (), opaque: bool = False,
               ) -> bool:
        """`checks` are matched as `patterns` are; `opaque` (a command not known) needs the strictest rule to allow."""
        if opaque and self.strictest(permission) != "allow":
            return False
        return all(self.action(permission, text) == "allow" for texts in (patterns, checks) for text in texts)

    def strictest(self, permission: str) -> str:
        """The strictest action of the rules that decide some pattern of `permission` (the control plane's
        `permission.strictest`), the ceiling's included: from the newest back to the last catch-all `*`, or
        the default ask with none. Approvals are left out: they are answers about patterns, and no pattern
        stands for such a command."""
        found = "allow"
        for name, glob, action in self._ruleset:
            if not match(permission, name):
                continue
            found = _stricter(found, action)
            if glob and glob.strip("*") == "":
                break
        else:
            found = found if found == "deny" else "ask"
        if self._ceiling is None or found == "deny":
            return found
        return _stricter(found, self._ceiling.strictest(permission))
