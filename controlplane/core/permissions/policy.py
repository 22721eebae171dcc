"""Operator policy: permission rules from the control plane's own config, global and per tenant.

They are evaluated after everything a project or a user decided (agent and project rules, then
the session's "always" approvals), so an operator's deny always has the last word.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.core.permissions import permission
from controlplane.core.permissions.permission import Ruleset


@dataclass(frozen=True)
class OperatorPolicy:
    permission: Mapping[str, Any] | str = field(default_factory=dict)
    """Applies to every tenant, in opencode.json's `permission` format."""
    tenants: Mapping[str, Mapping[str, Any] | str] = field(default_factory=dict)
    """Per tenant, merged after the global rules."""
    _parsed: dict[tuple[str, str], Ruleset] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Rules already built, by (tenant, home): every tool call asks for them."""

    def rules(self, tenant: str, *, home: str) -> Ruleset:
        key = (tenant, home)
        cached = self._parsed.get(key)
        if cached is None:
            cached = self._parsed[key] = self._build(tenant, home)
        return cached

    def _build(self, tenant: str, home: str) -> Ruleset:
        tenant_rules = self.tenants.get(tenant)
        # Unlike opencode.json, any key may hold patterns: an operator may deny `webfetch` for some URLs.
        return permission.merge(
            permission.from_config(self.permission, home=home, action_only=frozenset()) if self.permission else [],
            permission.from_config(tenant_rules, home=home, action_only=frozenset()) if tenant_rules else [],
        )

    def validate(self) -> None:
        """Raises ConfigError on a malformed rule, so a bad policy stops the control plane at start."""
        for tenant in ("", *self.tenants):
            self.rules(tenant, home="/")
