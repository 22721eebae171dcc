"""The SSRF guard and the guarded fetch, against real HTTP(S) servers on loopback."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from controlplane import egress
from controlplane.egress import EgressPolicy
from controlplane.errors import ConfigError
from tests.unit.tools.web_support import (
    Guard,
    LoopbackServer,
    declared,
    echo,
    make_certificates,
    redirect,
    slow,
    streamed,
)

LOOPBACK_ONLY = EgressPolicy(allow_cidrs=("127.0.0.1/32",))
BLOCKED = "(blocked by the platform's egress policy)"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as srv:
        srv.routes["/"] = lambda h: h.reply(200, b"hello", "text/plain")
        yield srv


async def get(
    url: str, policy: EgressPolicy, *, method: str = "GET", headers: Mapping[str, str] | None = None,
    content: bytes | None = None,
) -> tuple[int, bytes, str]:
    async with egress.open_url(url, policy, method=method, headers=headers, content=content) as response:
        return response.status, await response.read(), str(response.url)


# --- classification ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("172.31.255.255", "a private address"),
        ("192.168.1.1", "a private address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("169.254.170.2", "a cloud metadata address"),
        ("100.100.100.200", "a cloud metadata address"),
        ("169.254.1.1", "a link-local address"),
        ("100.64.0.1", "a carrier-grade NAT (shared) address"),
        ("100.127.255.254", "a carrier-grade NAT (shared) address"),
        ("0.0.0.0", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("240.0.0.1", "a reserved or non-public address"),
        ("255.255.255.255", "a reserved or non-public address"),
        ("192.0.2.10", "a reserved or non-public address"),
        ("198.18.0.1", "a reserved or non-public address"),
        ("::1", "a loopback address"),
        ("::", "an unspecified address"),
        ("fe80::1", "a link-local address"),
        ("fd12:3456::1", "a private address"),
        ("fc00::1", "a private address"),
        ("fd00:ec2::254", "a cloud metadata address"),
        ("ff02::1", "a multicast address"),
        ("2001:db8::1", "a reserved or non-public address"),
        ("::ffff:127.0.0.1", "an IPv6 form of 127.0.0.1, a loopback address"),
        ("::ffff:10.1.2.3", "an IPv6 form of 10.1.2.3, a private address"),
        ("::ffff:169.254.169.254", "an IPv6 form of 169.254.169.254, a cloud metadata address"),
        ("2002:a00:1::", "an IPv6 form of 10.0.0.1, a private address"),
        ("64:ff9b::a9fe:a9fe", "an IPv6 form of 169.254.169.254, a cloud metadata address"),
        ("::7f00:1", "an IPv6 form of 127.0.0.1, a loopback address"),
    ],
)
def test_refused_addresses_name_their_reason(address: str, reason: str) -> None:
    assert egress.refusal_reason(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "172.32.0.1", "100.128.0.1",
                                     "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::"])
def test_public_addresses_pass(address: str) -> None:
    assert egress.refusal_reason(ipaddress.ip_address(address)) is None


def test_policy_rejects_a_bad_cidr() -> None:
    with pytest.raises(ConfigError, match="egress allow_cidrs"):
        EgressPolicy(allow_cidrs=("10.0.0.0/33",))


def test_policy_matches_hosts_and_networks() -> None:
    policy = EgressPolicy(allow_cidrs=("10.1.0.0/16", "fd00::/8"), allow_hosts=("Intranet.Example.", "*.corp.test"))
    assert policy.allows_host("intranet.example")
    assert policy.allows_host("a.b.corp.test")
    assert not policy.allows_host("corp.test")
    assert not policy.allows_host("evilcorp.test")
    assert policy.allows_address(ipaddress.ip_address("10.1.200.3"))
    assert not policy.allows_address(ipaddress.ip_address("10.2.0.1"))
    assert policy.allows_address(ipaddress.ip_address("fd00:ec2::254"))
    assert not policy.allows_address(ipaddress.ip_address("::ffff:10.1.0.1"))


# --- refusals happen before any connection ------------------------------------------------------------


async def test_loopback_literal_is_refused_before_connecting(guard: Guard, server: LoopbackServer) -> None:
    with pytest.raises(egress.EgressRefusedError) as info:
        await get(f"http://127.0.0.1:{server.port}", EgressPolicy())
    assert str(info.value) == (
        f"Refusing to fetch http://127.0.0.1:{server.port}/: 127.0.0.1 is a loopback address {BLOCKED}"
    )
    assert guard.connections == []
    assert guard.lookups == []
    assert server.connections == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://10.0.0.1/", f"Refusing to fetch http://10.0.0.1/: 10.0.0.1 is a private address {BLOCKED}"),
        ("http://169.254.169.254/latest/meta-data/",
         "Refusing to fetch http://169.254.169.254/latest/meta-data/: 169.254.169.254 is a cloud metadata address "
         + BLOCKED),
        ("https://[fd00:ec2::254]/latest",
         f"Refusing to fetch https://[fd00:ec2::254]/latest: fd00:ec2::254 is a cloud metadata address {BLOCKED}"),
        ("http://[::1]:8080/x", f"Refusing to fetch http://[::1]:8080/x: ::1 is a loopback address {BLOCKED}"),
        ("http://[::ffff:7f00:1]/", "Refusing to fetch http://[::ffff:7f00:1]/: ::ffff:7f00:1 is an IPv6 form of "
         f"127.0.0.1, a loopback address {BLOCKED}"),
        ("http://0.0.0.0:9/", f"Refusing to fetch http://0.0.0.0:9/: 0.0.0.0 is an unspecified address {BLOCKED}"),
        ("http://100.64.1.1/", "Refusing to fetch http://100.64.1.1/: 100.64.1.1 is a carrier-grade NAT (shared) "
         f"address {BLOCKED}"),
        ("http://metadata.google.internal/computeMetadata/v1/",
         "Refusing to fetch http://metadata.google.internal/computeMetadata/v1/: metadata.google.internal is a cloud "
         f"metadata host {BLOCKED}"),
        ("http://METADATA.google.internal./", "Refusing to fetch http://metadata.google.internal./: "
         f"metadata.google.internal is a cloud metadata host {BLOCKED}"),
    ],
)
async def test_non_public_destinations_are_refused_without_any_traffic(guard: Guard, url: str, message: str) -> None:
    with pytest.raises(egress.EgressRefusedError) as info:
        await get(url, EgressPolicy())
    assert str(info.value) == message
    assert guard.connections == []
    assert guard.lookups == []


async def test_a_name_resolving_to_loopback_is_refused(guard: Guard, server: LoopbackServer) -> None:
    with pytest.raises(egress.EgressRefusedError) as info:
        await get(server.url("/", host="localhost"), EgressPolicy())
    candidates = {
        f"Refusing to fetch http://localhost:{server.port}/: localhost resolves to {a}, a loopback address {BLOCKED}"
        for a in ("127.0.0.1", "::1")
    }
    assert str(info.value) in candidates
    assert guard.lookups == ["localhost"]
    assert guard.connections == []
    assert server.connections == 0


async def test_an_allowed_cidr_does_not_allow_other_addresses(guard: Guard, server: LoopbackServer) -> None:
    with pytest.raises(egress.EgressRefusedError, match=r"127\.0\.0\.1 is a loopback address"):
        await get(server.url(), EgressPolicy(allow_cidrs=("10.0.0.0/8",)))
    assert guard.connections == []


async def test_other_schemes_are_refused(guard: Guard) -> None:
    with pytest.raises(egress.EgressRefusedError) as info:
        await get("ftp://127.0.0.1/file", LOOPBACK_ONLY)
    assert str(info.value) == "Refusing to fetch ftp://127.0.0.1/file: only http and https URLs can be fetched"


async def test_invalid_url_and_unknown_host(guard: Guard) -> None:
    with pytest.raises(egress.FetchFailedError, match="it names no host"):
        await get("http://", LOOPBACK_ONLY)
    with pytest.raises(egress.FetchFailedError) as info:
        await get("http://no-such-host.invalid/", LOOPBACK_ONLY)
    assert str(info.value) == "Unable to resolve no-such-host.invalid: Name or service not known"
    assert guard.lookups == ["no-such-host.invalid"]
    assert guard.connections == []


# --- allowed destinations: pinned to the vetted address -------------------------------------------------


async def test_allowed_cidr_fetches_and_sends_the_host_header(guard: Guard, server: LoopbackServer) -> None:
    status, body, url = await get(server.url("/"), LOOPBACK_ONLY, headers={"X-Test": "1"})
    assert (status, body, url) == (200, b"hello", server.url("/"))
    assert server.seen[0].headers["host"] == f"127.0.0.1:{server.port}"
    assert server.seen[0].headers["x-test"] == "1"
    assert guard.connections == ["127.0.0.1"]


async def test_allowed_host_is_resolved_once_and_the_address_is_dialled(guard: Guard, server: LoopbackServer) -> None:
    status, body, _ = await get(server.url("/", host="localhost"), EgressPolicy(allow_hosts=("localhost",)))
    assert (status, body) == (200, b"hello")
    assert server.seen[0].headers["host"] == f"localhost:{server.port}"
    assert guard.lookups == ["localhost"]
    # The HTTP client only ever gets literal addresses: there is no second lookup to rebind.
    assert guard.connections
    assert all(ipaddress.ip_address(c).is_loopback for c in guard.connections)
    assert guard.connections[-1] == "127.0.0.1"


async def test_connection_failure_is_reported(guard: Guard) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(egress.FetchFailedError) as info:
        await get(f"http://127.0.0.1:{port}/", LOOPBACK_ONLY)
    assert str(info.value).startswith(f"Unable to connect to http://127.0.0.1:{port}/: ")


# --- redirects ---------------------------------------------------------------------------------------------


async def test_redirects_are_followed_and_each_hop_is_vetted(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/a"] = redirect("/b")
    server.routes["/b"] = redirect(server.url("/c"), 301)
    server.routes["/c"] = lambda h: h.reply(200, b"final", "text/plain")
    status, body, url = await get(server.url("/a"), LOOPBACK_ONLY)
    assert (status, body, url) == (200, b"final", server.url("/c"))
    assert [s.path for s in server.seen] == ["/a", "/b", "/c"]


async def test_redirect_to_a_refused_address_is_refused(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/go"] = redirect("http://169.254.169.254/latest/meta-data/iam/")
    with pytest.raises(egress.EgressRefusedError) as info:
        await get(server.url("/go"), LOOPBACK_ONLY)
    assert str(info.value) == (
        "Refusing to fetch http://169.254.169.254/latest/meta-data/iam/: 169.254.169.254 is a cloud metadata address "
        + BLOCKED
    )
    assert guard.connections == ["127.0.0.1"]


async def test_redirect_to_a_name_resolving_to_loopback_is_refused(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/go"] = redirect(server.url("/", host="localhost"))
    # Trusting the name "127.0.0.1" says nothing about other names that resolve to that address.
    with pytest.raises(egress.EgressRefusedError, match=r"localhost resolves to (127\.0\.0\.1|::1), a loopback"):
        await get(server.url("/go"), EgressPolicy(allow_hosts=("127.0.0.1",)))
    assert guard.connections == ["127.0.0.1"]


async def test_redirect_loop_stops_after_ten_hops(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/loop"] = redirect("/loop", 307)
    with pytest.raises(egress.FetchFailedError) as info:
        await get(server.url("/loop"), LOOPBACK_ONLY)
    assert str(info.value) == f"Too many redirects (more than 10) fetching {server.url('/loop')}"
    assert len(server.seen) == 11


async def test_ten_redirects_are_still_followed(guard: Guard, server: LoopbackServer) -> None:
    for i in range(10):
        server.routes[f"/r{i}"] = redirect(f"/r{i + 1}")
    server.routes["/r10"] = lambda h: h.reply(200, b"made it", "text/plain")
    status, body, _ = await get(server.url("/r0"), LOOPBACK_ONLY)
    assert (status, body) == (200, b"made it")


async def test_303_turns_a_post_into_a_get_and_307_keeps_it(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/see-other"] = redirect("/echo", 303)
    server.routes["/temporary"] = redirect("/echo", 307)
    server.routes["/echo"] = echo
    for path, expected in (("/see-other", {"method": "GET", "body": ""}),
                           ("/temporary", {"method": "POST", "body": "payload"})):
        _, body, _ = await get(server.url(path), LOOPBACK_ONLY, method="POST", content=b"payload",
                               headers={"content-type": "text/plain"})
        assert json.loads(body) == expected


async def test_credentials_do_not_follow_a_redirect_to_another_origin(guard: Guard, server: LoopbackServer) -> None:
    with LoopbackServer() as other:
        other.routes["/"] = lambda h: h.reply(200, b"other", "text/plain")
        server.routes["/same"] = redirect("/")
        server.routes["/cross"] = redirect(other.url("/"))
        secret = {"x-api-key": "s3cret", "Authorization": "Bearer t"}
        await get(server.url("/same"), LOOPBACK_ONLY, headers=secret)
        await get(server.url("/cross"), LOOPBACK_ONLY, headers=secret)
    assert server.seen[1].headers["x-api-key"] == "s3cret"
    assert server.seen[1].headers["authorization"] == "Bearer t"
    assert "x-api-key" not in other.seen[0].headers
    assert "authorization" not in other.seen[0].headers


# --- size cap ---------------------------------------------------------------------------------------------


async def test_size_cap_by_header_and_by_body(guard: Guard, server: LoopbackServer) -> None:
    policy = EgressPolicy(allow_cidrs=("127.0.0.1/32",), max_bytes=1000)
    server.routes["/declared"] = declared(1001)
    server.routes["/streamed"] = streamed(1001)
    server.routes["/exact"] = streamed(1000)
    for path in ("/declared", "/streamed"):
        with pytest.raises(egress.ResponseTooLargeError) as info:
            await get(server.url(path), policy)
        assert str(info.value) == "Response too large (exceeds 1000 bytes limit)"
    _, body, _ = await get(server.url("/exact"), policy)
    assert len(body) == 1000


def test_size_message_in_megabytes() -> None:
    assert egress.too_large_message(5 * 1024 * 1024) == "Response too large (exceeds 5MB limit)"


# --- time limits -------------------------------------------------------------------------------------------


async def test_timeout_and_abort_end_a_slow_request(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/slow"] = slow(10)
    started = time.monotonic()
    with pytest.raises(egress.FetchTimeoutError) as info:
        await egress.bounded(get(server.url("/slow"), LOOPBACK_ONLY), seconds=0.3)
    assert str(info.value) == "The request timed out after 0.3 seconds"
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, abort.set)
    with pytest.raises(egress.FetchAbortedError):
        await egress.bounded(get(server.url("/slow"), LOOPBACK_ONLY), seconds=30, abort=abort)
    assert time.monotonic() - started < 3


async def test_bounded_returns_the_result_and_an_already_set_abort_wins(server: LoopbackServer) -> None:
    assert await egress.bounded(get(server.url("/"), LOOPBACK_ONLY), seconds=5) == (200, b"hello", server.url("/"))
    abort = asyncio.Event()
    abort.set()
    with pytest.raises(egress.FetchAbortedError):
        await egress.bounded(asyncio.sleep(5), seconds=5, abort=abort)
    with pytest.raises(egress.FetchTimeoutError):
        await egress.bounded(asyncio.sleep(5), seconds=0)


# --- TLS: SNI and certificate checks use the name, the socket uses the vetted address --------------------


async def test_https_uses_the_name_for_sni_and_verification(guard: Guard, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    with LoopbackServer(tls=certs.server_context()) as tls_server:
        tls_server.routes["/"] = lambda h: h.reply(200, b"secure", "text/plain")
        policy = EgressPolicy(allow_hosts=("localhost",), tls_context=certs.client_context())
        status, body, _ = await get(tls_server.url("/", host="localhost"), policy)
        assert (status, body) == (200, b"secure")
        assert tls_server.server_names[-1] == "localhost"
        assert tls_server.seen[0].headers["host"] == f"localhost:{tls_server.port}"
        assert all(ipaddress.ip_address(c).is_loopback for c in guard.connections)
        # The certificate names only "localhost": reaching the same server by address must fail verification.
        by_address = EgressPolicy(allow_cidrs=("127.0.0.1/32",), tls_context=certs.client_context())
        with pytest.raises(egress.FetchFailedError, match="CERTIFICATE_VERIFY_FAILED"):
            await get(tls_server.url("/"), by_address)
