"""NetworkRules: a session's host patterns and CIDRs, and the check that a session asks no more than its
tenant's cap."""

from __future__ import annotations

import pytest

from controlplane.egress import EgressPolicy
from controlplane.egress_proxy.rules import NetworkRules
from controlplane.errors import InvalidArgumentError


def test_exact_host_any_port_unless_one_is_given() -> None:
    rules = NetworkRules(["pypi.example", "git.example:443"])
    assert rules.allows("pypi.example", 80)
    assert rules.allows("PyPI.Example.", 8443)
    assert rules.allows("git.example", 443)
    assert not rules.allows("git.example", 80)
    assert not rules.allows("evil.example", 80)
    assert not rules.allows("pypi.example.evil.test", 80)


def test_a_wildcard_matches_subdomains_only_as_the_operator_guard_does() -> None:
    rules = NetworkRules(["*.example.org"])
    assert rules.allows("a.example.org", 443)
    assert rules.allows("a.b.example.org", 443)
    assert not rules.allows("example.org", 443)
    assert not rules.allows("badexample.org", 443)
    # One meaning across the platform: the operator's guard reads `*.domain` the same way.
    guard = EgressPolicy(allow_hosts=("*.example.org",))
    for host in ("a.example.org", "example.org", "badexample.org"):
        assert guard.allows_host(host) == rules.allows(host, 443)


def test_cidrs_admit_ip_literals_but_never_names() -> None:
    rules = NetworkRules(allow_cidrs=["203.0.113.0/24", "2001:db8::/32"])
    assert rules.allows("203.0.113.7", 80)
    assert rules.allows("[2001:db8::1]", 443)
    assert not rules.allows("203.0.114.1", 80)
    assert not rules.allows("host.example", 80)  # a name is not resolved to be compared


@pytest.mark.parametrize("pattern", ["", "*", "*.", "a.*.example", "exa mple.org", "ex_ample.org:0",
                                     "example.org:99999", "example.org:http", "bücher.example", "[::1",
                                     "*.10.0.0.1", "-bad.example", "a..b"])
def test_a_bad_host_pattern_is_a_clear_error(pattern: str) -> None:
    with pytest.raises(InvalidArgumentError, match="network policy") as caught:
        NetworkRules([pattern])
    assert repr(pattern) in str(caught.value)


def test_a_bad_cidr_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'10\.0\.0\.0/33' is not a CIDR"):
        NetworkRules(allow_cidrs=["10.0.0.0/33"])


def test_ipv6_literal_patterns_with_and_without_ports() -> None:
    rules = NetworkRules(["[2001:db8::5]:8080", "2001:db8::6"])
    assert rules.allows("[2001:db8::5]", 8080)
    assert not rules.allows("[2001:db8::5]", 80)
    assert rules.allows("2001:db8::6", 1)


def test_first_not_within_names_what_the_cap_does_not_cover() -> None:
    cap = NetworkRules(["*.example.org", "pypi.example", "git.example:443"], ["10.1.0.0/16"])
    assert NetworkRules(["a.example.org", "*.b.example.org", "pypi.example:8080", "git.example:443"],
                        ["10.1.2.0/24"]).first_not_within(cap) is None
    assert NetworkRules(["10.1.9.9"]).first_not_within(cap) is None
    assert NetworkRules(["example.org"]).first_not_within(cap) == "example.org"
    assert NetworkRules(["git.example"]).first_not_within(cap) == "git.example"  # any port > 443 only
    assert NetworkRules(["git.example:22"]).first_not_within(cap) == "git.example:22"
    assert NetworkRules(["pypi.example", "*.example.net"]).first_not_within(cap) == "*.example.net"
    assert NetworkRules(allow_cidrs=["10.0.0.0/8"]).first_not_within(cap) == "10.0.0.0/8"
    assert NetworkRules(["anything.test"]).first_not_within(NetworkRules()) == "anything.test"
    assert NetworkRules().first_not_within(NetworkRules()) is None
