"""A tenant's cap on its sessions' networks: `[[tenants]] egress = {allow_hosts, allow_cidrs, credentials}`.

Kept beside controlplane/config.py (which is at its size bound), as the operator's `[egress]` is
(config_egress.py), whose credential model it shares.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.config_egress import EgressCredentialConfig
from controlplane.egress_proxy.types import Credential


class TenantEgressConfig(BaseModel):
    """What this tenant's sessions may ask for in CreateSessionRequest.network: nothing by default (a session
    asking for more is INVALID_ARGUMENT naming the entry). The operator's `[egress]` still vets every address."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_hosts: list[str] = Field(default_factory=list)
    """Host patterns a session may list: `host`, `*.domain` (its subdomains), either with `:port`."""
    allow_cidrs: list[str] = Field(default_factory=list)
    """Networks whose IP literals a session may list (its own `allow_cidrs` must lie within one)."""
    credentials: list[EgressCredentialConfig] = Field(default_factory=list)
    """Headers the proxy adds for this tenant's sessions only (as `[egress] credentials`, which apply to all)."""

    @field_validator("allow_hosts")
    @classmethod
    def _host_patterns(cls, hosts: list[str]) -> list[str]:
        from controlplane.egress_proxy.rules import HostPattern

        for host in hosts:
            HostPattern.parse(host)  # InvalidArgumentError is a ValueError: pydantic names the field
        return hosts

    @field_validator("allow_cidrs")
    @classmethod
    def _networks(cls, cidrs: list[str]) -> list[str]:
        from controlplane.egress_proxy.rules import NetworkRules

        NetworkRules((), cidrs)
        return cidrs

    def credential_list(self) -> list[Credential]:
        return [c.credential() for c in self.credentials]
