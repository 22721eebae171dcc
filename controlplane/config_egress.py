"""The `[egress]` section: where the control plane's own tools and the sessions' network proxies may connect,
the static name map, and the credentials the proxy adds on the way out."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from controlplane.config_base import _Closed
from controlplane.egress_proxy.types import Credential
from controlplane.errors import ConfigError


class EgressCredentialConfig(_Closed):
    """`{ host = "pypi.internal", header = "Authorization", value = "Bearer ..." }`."""

    host: str
    """`host` or `*.domain`, optionally `:port`, as in the allowlists."""
    header: str
    value: SecretStr
    """A secret: never logged, audited or sent into a sandbox (a SecretStr, so that neither a repr nor a
    validation error prints it)."""

    @field_validator("host")
    @classmethod
    def _host_pattern(cls, host: str) -> str:
        from controlplane.egress_proxy.rules import HostPattern

        HostPattern.parse(host)  # InvalidArgumentError is a ValueError: pydantic reports it with the field
        return host

    @field_validator("header")
    @classmethod
    def _header_name(cls, header: str) -> str:
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", header):
            raise ValueError(f"egress.credentials: {header!r} is not a header name")
        if header.lower() in _FRAMING_HEADERS:
            raise ValueError(f"egress.credentials: {header} says how a message is framed or routed; it cannot "
                             "carry a credential")
        return header

    def credential(self) -> Credential:
        """The proxy's Credential; ConfigError for a value that is not one non-empty line (checked here, not
        by a validator: pydantic's errors print the input, and this input is a secret)."""
        text = self.value.get_secret_value()
        if not text or any(c in text for c in "\r\n\0"):
            raise ConfigError(f"egress.credentials: the value for {self.header} on {self.host} must be one "
                              "non-empty line")
        return Credential(self.host, self.header, text)


_FRAMING_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "upgrade",
    "te", "trailer", "expect", "proxy-authorization",
})


class EgressConfig(_Closed):
    """Where control-plane tools (webfetch, websearch, codesearch) may connect. Loopback, private,
    link-local and cloud-metadata addresses are refused unless allowed here."""

    allow_cidrs: list[str] = Field(default_factory=list)
    """Networks allowed although private or local, e.g. ["10.1.0.0/16"]."""
    allow_hosts: list[str] = Field(default_factory=list)
    """Host names trusted whatever they resolve to (`host` or `*.domain`)."""
    max_bytes: int = Field(default=5 * 1024 * 1024, gt=0)
    """Largest response body."""
    hosts: dict[str, str] = Field(default_factory=dict)
    """A static name map, `{ "pypi.internal" = "10.2.0.5" }`, read before DNS by the session proxies (for
    air-gapped sites and tests). A name's address is still vetted like any other."""
    credentials: list[EgressCredentialConfig] = Field(default_factory=list)
    """Headers the session proxies add to requests for a host (a private index, a Git host); the value never
    enters a sandbox. HTTPS to such a host is opened by the proxy (a per-session CA the sandbox trusts)."""
    upstream_ca: Path | None = None
    """A PEM file of extra CAs the proxy trusts, beside the system store, when it opens TLS to a host with a
    credential (e.g. a site's own CA). Must exist at start."""
    session_budget_mb: int = Field(default=1024, ge=0)
    """What one session may move through its proxy (MiB, both ways together, over its whole life); the
    transfer that crosses it is cut. 0: no budget."""

    @field_validator("hosts")
    @classmethod
    def _static_hosts(cls, hosts: dict[str, str]) -> dict[str, str]:
        from controlplane.egress_proxy.rules import ip_literal, normal_host

        for name, address in hosts.items():
            if normal_host(name) is None or ip_literal(name) is not None:
                raise ValueError(f"egress.hosts: {name!r} is not a host name")
            if ip_literal(address) is None:
                raise ValueError(f"egress.hosts: {name} = {address!r} is not an IP address")
        return hosts

    @field_validator("upstream_ca")
    @classmethod
    def _ca_exists(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"egress.upstream_ca: {path} is not a readable file")
        return path

    def credential_list(self) -> list[Credential]:
        return [c.credential() for c in self.credentials]

    @property
    def session_budget_bytes(self) -> int | None:
        """The ByteMeter's budget for each session."""
        return self.session_budget_mb * 1024 * 1024 or None
