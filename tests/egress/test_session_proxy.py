"""SessionProxy against real servers on 127.0.0.1: what it lets through, what it refuses and why, and the
bounds it keeps. The operator's guard admits 127.0.0.1/32 where a test needs to reach its own servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.egress_proxy.proxy import ProxyLimits
from controlplane.egress_proxy.types import ByteMeter, Credential
from tests.egress.support import EchoServer, HttpUpstream, Seen, response, split_response, start_proxy

LOOPBACK = ["127.0.0.1/32"]
NAMES = {"allowed.test": "127.0.0.1", "other.test": "127.0.0.1", "evil.test": "127.0.0.1"}


@pytest.fixture
async def upstream() -> AsyncIterator[HttpUpstream]:
    server = await HttpUpstream().start()
    yield server
    await server.close()


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = await EchoServer().start()
    yield server
    await server.close()


def get(host: str, port: int, path: str = "/", *headers: str, method: str = "GET") -> bytes:
    lines = [f"{method} http://{host}:{port}{path} HTTP/1.1", f"Host: {host}:{port}", *headers, "", ""]
    return "\r\n".join(lines).encode()


async def test_an_allowed_host_is_reached_over_plain_http(tmp_path: Path, upstream: HttpUpstream) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        status, _, body = split_response(await p.exchange(get(
            "allowed.test", upstream.port, "/", "Proxy-Authorization: Basic c2VjcmV0", "Proxy-Connection: close")))
    finally:
        await p.proxy.close()
    assert (status, body) == (200, b"hello from upstream")
    [seen] = upstream.seen
    assert seen.target == "/"
    assert seen.header("host") == [f"allowed.test:{upstream.port}"]
    assert seen.header("proxy-authorization") == []
    assert seen.header("proxy-connection") == []
    [record] = p.records
    assert (record.host, record.address, record.decision) == ("allowed.test", "127.0.0.1", "allowed")
    assert record.bytes_up > 0
    assert record.bytes_down > len(b"hello from upstream")
    assert p.proxy.meter.total == record.bytes_up + record.bytes_down


async def test_connect_tunnels_bytes_to_the_vetted_address(tmp_path: Path, echo: EchoServer) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        reader, writer = await p.open()
        writer.write(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\nHost: allowed.test\r\n\r\n".encode())
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
        writer.write(b"ping over the tunnel")
        assert await reader.readexactly(20) == b"ping over the tunnel"
        writer.close()
        await asyncio.sleep(0.1)
    finally:
        await p.proxy.close()
    [record] = p.records
    assert (record.decision, record.bytes_up, record.bytes_down) == ("allowed", 20, 20)


async def test_a_nested_connect_inside_a_tunnel_only_reaches_the_first_server(tmp_path: Path,
                                                                               echo: EchoServer) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    nested = b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"
    try:
        reader, writer = await p.open()
        writer.write(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        writer.write(nested)
        # The inner CONNECT is payload: it arrives at the first server as it was sent, and comes back.
        assert await reader.readexactly(len(nested)) == nested
        writer.close()
        await asyncio.sleep(0.1)
    finally:
        await p.proxy.close()
    assert bytes(echo.received) == nested
    assert echo.connections == 1
    assert [r.host for r in p.records] == ["allowed.test"]


async def test_a_host_outside_the_policy_is_refused_naming_it(tmp_path: Path, upstream: HttpUpstream,
                                                              echo: EchoServer) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        plain = await p.exchange(get("evil.test", upstream.port))
        tunnel = await p.exchange(f"CONNECT evil.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
    finally:
        await p.proxy.close()
    for answer in (plain, tunnel):
        status, headers, body = split_response(answer)
        assert status == 403
        assert headers["connection"] == "close"
        assert b"ocsb egress: host evil.test (port " in body
        assert b"is not in this session's network policy" in body
    assert upstream.connections == 0
    assert echo.connections == 0
    assert [(r.host, r.decision, r.address) for r in p.records] == [("evil.test", "refused", "")] * 2


async def test_a_name_mapped_to_loopback_is_refused_without_the_operators_allowance(
        tmp_path: Path, upstream: HttpUpstream) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], static_hosts=NAMES)
    try:
        status, _, body = split_response(await p.exchange(get("allowed.test", upstream.port)))
        literal = split_response(await p.exchange(get("127.0.0.1", upstream.port)))
    finally:
        await p.proxy.close()
    assert status == 403
    assert body == b"ocsb egress: host allowed.test resolves to 127.0.0.1, a loopback address, refused by the " \
                   b"operator's egress policy\n"
    assert literal[0] == 403  # not in the session's policy either
    assert upstream.connections == 0


async def test_the_sessions_own_cidrs_never_override_the_operators_refusal(tmp_path: Path,
                                                                          upstream: HttpUpstream) -> None:
    p = await start_proxy(tmp_path, allow_cidrs=["127.0.0.0/8", "169.254.0.0/16"],
                          allow_hosts=["metadata.google.internal"])
    try:
        loop = split_response(await p.exchange(get("127.0.0.1", upstream.port)))
        meta = split_response(await p.exchange(get("169.254.169.254", 80, "/latest/meta-data/")))
        meta_name = split_response(await p.exchange(get("metadata.google.internal", 80)))
    finally:
        await p.proxy.close()
    assert loop[0] == 403
    assert b"127.0.0.1 is a loopback address" in loop[2]
    assert meta[0] == 403
    assert b"169.254.169.254 is a cloud metadata address" in meta[2]
    assert meta_name[0] == 403
    assert b"metadata.google.internal is a cloud metadata host" in meta_name[2]
    assert upstream.connections == 0


async def test_a_second_answer_cannot_move_a_vetted_connection(tmp_path: Path, upstream: HttpUpstream) -> None:
    answers = [["127.0.0.1"], ["169.254.169.254"], ["127.0.0.1", "10.0.0.7"]]
    lookups: list[str] = []

    async def rebinding(name: str, port: int) -> list[str]:
        lookups.append(name)
        return answers[len(lookups) - 1]

    p = await start_proxy(tmp_path, allow_hosts=["rebind.test"], operator_cidrs=LOOPBACK, resolver=rebinding)
    try:
        reader, writer = await p.open()
        for _ in range(3):  # one connection, three requests: resolved once, all to the vetted address
            writer.write(get("rebind.test", upstream.port))
            status, headers, _ = split_response(await reader.readuntil(b"\r\n\r\n") + b"\r\n\r\n")
            assert status == 200
            await reader.readexactly(int(headers["content-length"]))
        writer.close()
        assert len(lookups) == 1
        assert len(upstream.seen) == 3
        assert upstream.connections == 1
        # A new connection resolves again, and the rebound answer is vetted: refused, nothing connected.
        second = split_response(await p.exchange(get("rebind.test", upstream.port)))
        assert second[0] == 403
        assert b"resolves to 169.254.169.254, a cloud metadata address" in second[2]
        # One refused address among the answers refuses the name (no falling back to the good one).
        third = split_response(await p.exchange(get("rebind.test", upstream.port)))
        assert third[0] == 403
        assert b"resolves to 10.0.0.7, a private address" in third[2]
    finally:
        await p.proxy.close()
    assert len(lookups) == 3
    assert upstream.connections == 1


async def test_a_request_for_another_host_on_a_kept_alive_connection_is_vetted_again(
        tmp_path: Path, upstream: HttpUpstream) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test", "other.test"], operator_cidrs=LOOPBACK,
                          static_hosts=NAMES)
    try:
        reader, writer = await p.open()
        for host in ("allowed.test", "other.test"):
            writer.write(get(host, upstream.port))
            _, headers, _ = split_response(await reader.readuntil(b"\r\n\r\n") + b"\r\n\r\n")
            await reader.readexactly(int(headers["content-length"]))
        writer.write(get("evil.test", upstream.port))
        status, _, body = split_response(await asyncio.wait_for(reader.read(-1), 5))
        writer.close()
    finally:
        await p.proxy.close()
    assert status == 403
    assert b"host evil.test" in body
    assert [s.header("host") for s in upstream.seen] == [[f"allowed.test:{upstream.port}"],
                                                          [f"other.test:{upstream.port}"]]
    assert [(r.host, r.decision) for r in p.records] == [
        ("allowed.test", "allowed"), ("evil.test", "refused"), ("other.test", "allowed")] or \
        sorted((r.host, r.decision) for r in p.records) == [
        ("allowed.test", "allowed"), ("evil.test", "refused"), ("other.test", "allowed")]
    assert upstream.connections == 2


async def test_a_redirect_to_a_disallowed_host_is_passed_back_not_followed(tmp_path: Path,
                                                                          upstream: HttpUpstream) -> None:
    async def redirect(_: Seen) -> bytes:
        return response(302, b"", ("Location", "http://evil.test/steal"))

    upstream.routes["/go"] = redirect
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        status, headers, _ = split_response(await p.exchange(get("allowed.test", upstream.port, "/go",
                                                                 "Connection: close")))
    finally:
        await p.proxy.close()
    assert status == 302
    assert headers["location"] == "http://evil.test/steal"
    assert [s.target for s in upstream.seen] == ["/go"]
    assert [r.host for r in p.records] == ["allowed.test"]


async def test_chunked_bodies_are_relayed_both_ways(tmp_path: Path, upstream: HttpUpstream) -> None:
    async def chunked(seen: Seen) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n")

    upstream.routes["/c"] = chunked
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        reader, writer = await p.open()
        writer.write(get("allowed.test", upstream.port, "/c", "Transfer-Encoding: chunked", method="POST")
                     + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        raw = await reader.readuntil(b"X-Trailer: yes\r\n\r\n")
        writer.write(get("allowed.test", upstream.port, "/", "Content-Length: 4", method="PUT") + b"wxyz")
        second = await reader.readuntil(b"hello from upstream")
        writer.close()
    finally:
        await p.proxy.close()
    assert raw.endswith(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n")
    assert second.startswith(b"HTTP/1.1 200")
    assert [s.body for s in upstream.seen] == [b"abcde", b"wxyz"]
    assert upstream.connections == 1


async def test_the_byte_budget_cuts_a_large_download(tmp_path: Path, upstream: HttpUpstream) -> None:
    size = 4 * 1024 * 1024

    async def big(_: Seen) -> bytes:
        return response(200, b"x" * size)

    upstream.routes["/big"] = big
    budget = 256 * 1024
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES,
                          budget=budget)
    try:
        received = await p.exchange(get("allowed.test", upstream.port, "/big"))
        # The budget is the session's: a second connection gets nothing through either.
        again = await p.exchange(get("allowed.test", upstream.port, "/"))
    finally:
        await p.proxy.close()
    assert len(received) <= budget
    assert received.startswith(b"HTTP/1.1 200")
    assert b"hello" not in again
    assert all("network budget of 262144 bytes is spent" in r.reason for r in p.records)
    assert sum(r.bytes_up + r.bytes_down for r in p.records) <= p.proxy.meter.total


async def test_the_connection_cap_answers_503(tmp_path: Path) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], limits=ProxyLimits(max_connections=2))
    try:
        held = [await p.open() for _ in range(2)]
        await asyncio.sleep(0.05)
        status, _, body = split_response(await p.exchange(get("allowed.test", 80)))
        assert status == 503
        assert b"already has 2 connections open" in body
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.1)
        assert p.proxy.open_connections == 0
    finally:
        await p.proxy.close()


@pytest.mark.parametrize(("raw", "message"), [
    (b"this is not http\r\n\r\n", b"malformed"),
    (b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", b"is not an absolute http:// URL"),
    (b"GET https://allowed.test/ HTTP/1.1\r\n\r\n", b"use CONNECT for https"),
    (b"CONNECT allowed.test HTTP/1.1\r\n\r\n", b"bad CONNECT target"),
    (b"CONNECT ::1:443 HTTP/1.1\r\n\r\n", b"bad CONNECT target"),
    (b"GET http://allowed.test/ HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", b"malformed header line"),
    (b"GET http://allowed.test/ HTTP/1.1\r\nHost : x\r\n\r\n", b"malformed header line"),
    (b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
     b"both Transfer-Encoding and Content-Length"),
    (b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
     b"unusable Content-Length"),
    (b"POST http://allowed.test/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", b"only request transfer"),
    (b"GET http://bad_host!/ HTTP/1.1\r\n\r\n", b"is not a host name"),
    (b"GET http://allowed.test/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b"too large"),
])
async def test_malformed_requests_get_400(tmp_path: Path, raw: bytes, message: bytes) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        status, _, body = split_response(await p.exchange(raw))
    finally:
        await p.proxy.close()
    assert status == 400
    assert message in body, body
    assert p.records == []


async def test_a_brokered_credential_replaces_the_clients_header_on_plain_http(
        tmp_path: Path, upstream: HttpUpstream) -> None:
    secret = Credential("allowed.test", "Authorization", "Bearer operator-secret")
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test", "other.test"], operator_cidrs=LOOPBACK,
                          static_hosts=NAMES, credentials=[secret])
    try:
        await p.exchange(get("allowed.test", upstream.port, "/", "authorization: Bearer forged", "Connection: close"))
        await p.exchange(get("other.test", upstream.port, "/", "Connection: close"))
    finally:
        await p.proxy.close()
    assert upstream.seen[0].header("authorization") == ["Bearer operator-secret"]
    assert upstream.seen[1].header("authorization") == []
    assert all("operator-secret" not in repr(r) for r in p.records)


async def test_close_cuts_open_tunnels_and_removes_the_socket(tmp_path: Path, echo: EchoServer) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    reader, writer = await p.open()
    writer.write(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    assert p.path.stat().st_mode & 0o777 == 0o666
    await p.proxy.close()
    assert await asyncio.wait_for(reader.read(-1), 5) == b""
    writer.close()
    assert not p.path.exists()
    assert p.proxy.open_connections == 0
    assert [r.decision for r in p.records] == ["allowed"]


async def test_a_response_framed_two_ways_reaches_the_client_framed_one_way(tmp_path: Path,
                                                                          upstream: HttpUpstream) -> None:
    async def ambiguous(_: Seen) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4\r\nbody\r\n0\r\n\r\n")

    upstream.routes["/both"] = ambiguous
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        status, headers, body = split_response(await p.exchange(get("allowed.test", upstream.port, "/both",
                                                                    "Connection: close")))
    finally:
        await p.proxy.close()
    assert status == 200
    assert "content-length" not in headers
    assert body == b"4\r\nbody\r\n0\r\n\r\n"


async def test_the_byte_budget_cuts_a_tunnel(tmp_path: Path, echo: EchoServer) -> None:
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES,
                          budget=10_000)
    try:
        reader, writer = await p.open()
        writer.write(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(20):
                writer.write(b"u" * 4096)
                await writer.drain()
                await asyncio.sleep(0.01)
        back = bytearray()
        with contextlib.suppress(ConnectionError):
            while chunk := await asyncio.wait_for(reader.read(65536), 5):
                back += chunk
        writer.close()
    finally:
        await p.proxy.close()
    assert len(echo.received) + len(back) <= 10_000
    [record] = p.records
    assert "network budget of 10000 bytes is spent" in record.reason


async def test_silent_clients_and_idle_tunnels_are_closed(tmp_path: Path, echo: EchoServer) -> None:
    limits = ProxyLimits(head_timeout_s=0.3, idle_timeout_s=0.3)
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES,
                          limits=limits)
    try:
        silent_reader, silent_writer = await p.open()
        assert await asyncio.wait_for(silent_reader.read(-1), 5) == b""
        silent_writer.close()
        reader, writer = await p.open()
        writer.write(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        assert await asyncio.wait_for(reader.read(-1), 5) == b""
        writer.close()
    finally:
        await p.proxy.close()
    assert p.proxy.open_connections == 0


class RecordingInterceptor:
    """Stands in for the credential broker's side of the seam: records what the proxy hands it and answers the
    client itself, so the test sees that only a vetted CONNECT to a credential's host reaches it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str, str]] = []

    async def intercept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, session_id: str,
                        host: str, port: int, address: str, credential: Credential, meter: ByteMeter) -> None:
        self.calls.append((host, port, address, credential.header))
        data = await reader.readexactly(5)
        meter.add(up=len(data))
        writer.write(b"seen:" + data)
        meter.add(down=10)
        await writer.drain()

    def session_ca_pem(self, session_id: str) -> bytes:
        return b""

    def forget(self, session_id: str) -> None:
        return None


async def test_a_connect_to_a_credentials_host_goes_to_the_interceptor_after_vetting(
        tmp_path: Path, echo: EchoServer) -> None:
    broker = RecordingInterceptor()
    secret = Credential("*.corp.test", "Authorization", "Bearer operator-secret")
    p = await start_proxy(tmp_path, allow_hosts=["git.corp.test", "allowed.test", "other.corp.test"],
                          operator_cidrs=LOOPBACK, static_hosts={**NAMES, "git.corp.test": "127.0.0.1",
                                                                 "other.corp.test": "10.9.9.9"},
                          credentials=[secret], interceptor=broker)
    try:
        reader, writer = await p.open()
        writer.write(b"CONNECT git.corp.test:443 HTTP/1.1\r\n\r\nhello")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
        assert await reader.readexactly(10) == b"seen:hello"
        writer.close()
        # A host without a credential is tunnelled untouched; a credential's host the guard refuses is refused.
        plain_reader, plain_writer = await p.open()
        plain_writer.write(f"CONNECT allowed.test:{echo.port} HTTP/1.1\r\n\r\n".encode())
        plain = await plain_reader.readuntil(b"\r\n\r\n")
        plain_writer.close()
        refused = split_response(await p.exchange(b"CONNECT other.corp.test:443 HTTP/1.1\r\n\r\n"))
    finally:
        await p.proxy.close()
    assert broker.calls == [("git.corp.test", 443, "127.0.0.1", "Authorization")]
    assert plain.startswith(b"HTTP/1.1 200")
    assert refused[0] == 403
    intercepted = [r for r in p.records if r.intercepted]
    assert [(r.host, r.bytes_up, r.bytes_down) for r in intercepted] == [("git.corp.test", 5, 10)]
    assert p.proxy.meter.total >= 15


async def test_a_server_that_closed_a_kept_alive_connection_gets_a_new_one(tmp_path: Path,
                                                                           upstream: HttpUpstream) -> None:
    async def closing(_: Seen) -> bytes:
        return response(200, b"bye", ("Connection", "close"))

    upstream.routes["/bye"] = closing
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        reader, writer = await p.open()
        for path in ("/bye", "/"):
            writer.write(get("allowed.test", upstream.port, path))
            _, headers, _ = split_response(await reader.readuntil(b"\r\n\r\n") + b"\r\n\r\n")
            await reader.readexactly(int(headers["content-length"]))
        writer.close()
    finally:
        await p.proxy.close()
    assert [s.target for s in upstream.seen] == ["/bye", "/"]
    assert upstream.connections == 2


async def test_an_upstream_that_answers_garbage_gets_the_client_a_502(tmp_path: Path, upstream: HttpUpstream) -> None:
    async def garbage(_: Seen) -> bytes:
        return b"SMTP ready\r\nnot http at all\r\n\r\n"

    upstream.routes["/smtp"] = garbage
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=LOOPBACK, static_hosts=NAMES)
    try:
        status, _, body = split_response(await p.exchange(get("allowed.test", upstream.port, "/smtp")))
    finally:
        await p.proxy.close()
    assert status == 502
    assert b"allowed.test sent no usable response: malformed" in body
    [record] = p.records
    assert record.reason.startswith("bad response")
