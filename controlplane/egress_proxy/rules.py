"""A session's network allowlist: which hosts (and ports) and which address ranges its tools may ask for.

Host patterns are `host`, `*.domain` (the subdomains of `domain`, not `domain` itself, as the operator's
`[egress] allow_hosts` reads them) and either with `:port`; without a port any port is allowed. CIDRs admit
IP literals only: a name is allowed by a host pattern or not at all, so the proxy never resolves a name the
session was not given (resolving arbitrary names would let a sandbox leak data through DNS queries).
These rules only narrow: whatever they allow is still vetted by the operator's guard (controlplane.egress).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.egress import IPAddress, IPNetwork
from controlplane.errors import InvalidArgumentError

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_MAX_NAME = 253


def normal_host(host: str) -> str | None:
    """`host` lower-cased, without a trailing dot and IPv6 brackets; None when it is no valid DNS name or IP
    literal (the proxy answers such a request 400, and a pattern naming one is refused)."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
        return str(ipaddress.IPv6Address(name)) if _is_ipv6(name) else None
    name = name.removesuffix(".")
    literal = ip_literal(name)
    if literal is not None:
        return str(literal)
    if not name or len(name) > _MAX_NAME or not name.isascii():
        return None
    return name if all(_LABEL.match(label) for label in name.split(".")) else None


def ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostPattern:
    """One parsed `allow_hosts` entry."""

    text: str
    """As written (what error messages and `first_not_within` name)."""
    host: str
    """The exact name, or for a wildcard the domain after `*.`."""
    wildcard: bool
    port: int | None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        raw = text.strip()
        host, port = _split_port(raw, text)
        wildcard = host.startswith("*.")
        name = normal_host(host[2:] if wildcard else host)
        if name is None or "*" in host[2 if wildcard else 0:]:
            raise InvalidArgumentError(
                f"network policy: {text!r} is not a host pattern (use `host`, `*.domain`, optionally with "
                f"`:port`; non-ASCII names in their xn-- form)")
        if wildcard and ip_literal(name) is not None:
            raise InvalidArgumentError(f"network policy: {text!r}: `*.` applies to domain names, not addresses")
        return cls(text, name, wildcard, port)

    def matches(self, host: str, port: int) -> bool:
        """`host` must already be normal (normal_host)."""
        if self.port is not None and self.port != port:
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host

    def within(self, other: HostPattern) -> bool:
        """Every (host, port) this pattern allows, `other` allows too."""
        if other.port is not None and other.port != self.port:
            return False
        if not other.wildcard:
            return not self.wildcard and self.host == other.host
        # `*.a.x` and `b.x` are within `*.x`; `x` itself and `*.x` within `*.x` only when both are wildcards.
        return self.host.endswith("." + other.host) or (self.wildcard and self.host == other.host)


def _split_port(raw: str, text: str) -> tuple[str, int | None]:
    if raw.startswith("["):
        host, bracket, rest = raw.partition("]")
        if not bracket:
            raise InvalidArgumentError(f"network policy: {text!r} has an unclosed `[`")
        host += "]"
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise InvalidArgumentError(f"network policy: {text!r}: only `:port` may follow `]`")
        return host, _port(rest[1:], text)
    if raw.count(":") == 1:
        host, _, port = raw.partition(":")
        return host, _port(port, text)
    # Several colons: a bare IPv6 address (a port needs the brackets).
    return raw, None


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise InvalidArgumentError(f"network policy: {whole!r}: the port must be a number from 1 to 65535")
    return int(text)


class NetworkRules:
    """What one session (or a tenant's cap) may reach, before the operator's guard has its say."""

    def __init__(self, allow_hosts: Iterable[str] = (), allow_cidrs: Iterable[str] = ()) -> None:
        self.hosts = tuple(HostPattern.parse(h) for h in allow_hosts)
        self._cidr_texts = tuple(allow_cidrs)
        self.cidrs = tuple(_network(c) for c in self._cidr_texts)

    @property
    def empty(self) -> bool:
        return not self.hosts and not self.cidrs

    def allows(self, host: str, port: int) -> bool:
        """Whether a request for `host`:`port` passes this allowlist (the host as the client wrote it)."""
        name = normal_host(host)
        if name is None:
            return False
        if any(p.matches(name, port) for p in self.hosts):
            return True
        literal = ip_literal(name)
        return literal is not None and any(_contains(n, literal) for n in self.cidrs)

    def first_not_within(self, cap: NetworkRules) -> str | None:
        """The first entry of these rules that `cap` does not cover (as written), or None when all are: a
        session may ask for no more than its tenant's cap."""
        for pattern in self.hosts:
            literal = ip_literal(pattern.host)
            by_cidr = literal is not None and any(_contains(n, literal) for n in cap.cidrs)
            if not by_cidr and not any(pattern.within(c) for c in cap.hosts):
                return pattern.text
        for network, text in zip(self.cidrs, self._cidr_texts, strict=True):
            if not any(network.version == c.version and network.subnet_of(c) for c in cap.cidrs):  # type: ignore[arg-type]
                return text
        return None

    def __repr__(self) -> str:
        return f"NetworkRules(hosts={[p.text for p in self.hosts]}, cidrs={[str(n) for n in self.cidrs]})"


def _network(text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError as exc:
        raise InvalidArgumentError(f"network policy: {text!r} is not a CIDR (e.g. 203.0.113.0/24): {exc}") from exc


def _contains(network: IPNetwork, address: IPAddress) -> bool:
    return network.version == address.version and address in network
