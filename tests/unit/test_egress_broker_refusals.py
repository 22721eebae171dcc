"""What the credential broker refuses, and that nothing reaches the upstream when it does: an upstream it cannot
verify, a request aimed at another host or tunnelling on, request smuggling shapes, oversized heads, and a
credential that would inject a header."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from controlplane.egress_proxy.broker import CredentialBroker
from controlplane.errors import ConfigError
from tests.unit.egress_tls import (
    HOST,
    Front,
    LoopbackCa,
    Upstream,
    client_context,
    credential,
    exchange,
    no_secret,
    routes,
    tunnel,
)


@pytest.fixture
def test_ca(tmp_path: Path) -> LoopbackCa:
    return LoopbackCa(tmp_path)


async def test_an_upstream_not_verifiable_gets_no_request_and_the_client_a_502(
    test_ca: LoopbackCa, tmp_path: Path
) -> None:
    rogue = LoopbackCa(tmp_path, name="rogue CA")
    broker = CredentialBroker(test_ca.ca_file)
    cases = {"another CA": rogue.server_context(HOST), "another name": test_ca.server_context("other.test")}
    for case, server_context in cases.items():
        async with Upstream(server_context, routes()) as up, Front(broker, credential(), {HOST: up.port}) as front:
            context = client_context(broker.session_ca_pem(front.session_id))

            def run(port: int = up.port, front_port: int = front.port, context: ssl.SSLContext = context) -> bytes:
                sock = tunnel(front_port, HOST, port, context)
                return exchange(sock, f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())

            received = await asyncio.to_thread(run)
        assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n"), case
        assert b"certificate could not be verified" in received, case
        assert up.seen == [], f"{case}: the upstream got a request"
        no_secret(received)


async def test_a_request_for_another_host_is_refused_and_not_forwarded(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))
        heads = {
            "Host switched": "GET /hello HTTP/1.1\r\nHost: other.test\r\n\r\n",
            "Host on another port": f"GET /hello HTTP/1.1\r\nHost: {HOST}:1\r\n\r\n",
            "absolute target": f"GET https://other.test/hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n",
            "suffix": f"GET /hello HTTP/1.1\r\nHost: {HOST}.other.test\r\n\r\n",
            "user info": f"GET https://{HOST}@other.test/ HTTP/1.1\r\nHost: {HOST}\r\n\r\n",
            "two Hosts": f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\nHost: other.test\r\n\r\n",
            "no Host": "GET /hello HTTP/1.1\r\n\r\n",
            "CONNECT inside": f"CONNECT other.test:443 HTTP/1.1\r\nHost: {HOST}\r\n\r\n",
            "websocket": f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "plain http target": f"GET http://{HOST}/hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n",
            "TRACE": f"TRACE /hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n",
        }

        def run() -> dict[str, bytes]:
            answers = {}
            for case, head in heads.items():
                answers[case] = exchange(tunnel(front.port, HOST, up.port, context), head.encode())
            # After a request that got the credential, a switched Host on the same connection is still refused.
            sock = tunnel(front.port, HOST, up.port, context)
            first = f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n"
            answers["after a good one"] = exchange(sock, (first + heads["Host switched"]).encode())
            return answers

        answers = await asyncio.to_thread(run)
    statuses = {case: data.split(b"\r\n")[0].decode() for case, data in answers.items()}
    assert statuses == {
        "Host switched": "HTTP/1.1 421 Misdirected Request",
        "Host on another port": "HTTP/1.1 421 Misdirected Request",
        "absolute target": "HTTP/1.1 421 Misdirected Request",
        "suffix": "HTTP/1.1 421 Misdirected Request",
        "user info": "HTTP/1.1 400 Bad Request",
        "two Hosts": "HTTP/1.1 400 Bad Request",
        "no Host": "HTTP/1.1 400 Bad Request",
        "CONNECT inside": "HTTP/1.1 405 Method Not Allowed",
        "websocket": "HTTP/1.1 501 Not Implemented",
        "plain http target": "HTTP/1.1 400 Bad Request",
        "TRACE": "HTTP/1.1 405 Method Not Allowed",
        "after a good one": "HTTP/1.1 200 OK",
    }
    assert answers["after a good one"].count(b"HTTP/1.1 421 Misdirected Request") == 1
    assert len(up.seen) == 1, "only the one good request was forwarded"
    no_secret(*answers.values())


async def test_smuggling_shapes_and_oversized_heads_are_refused(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))
        post = f"POST /hello HTTP/1.1\r\nHost: {HOST}\r\n"
        heads = {
            "length and chunked": post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "two lengths": post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            "not chunked last": post + "Transfer-Encoding: chunked, gzip\r\n\r\n",
            "folded line": post + "X-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n",
            "space before colon": post + "Content-Length : 5\r\n\r\nhello",
            "bare LF": f"GET /hello HTTP/1.1\nHost: {HOST}\n\n\r\n\r\n",
            "huge head": f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\nX-Pad: {'a' * 70000}\r\n\r\n",
            "bad chunk size": post + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        }

        def run() -> dict[str, bytes]:
            return {case: exchange(tunnel(front.port, HOST, up.port, context), head.encode())
                    for case, head in heads.items()}

        answers = await asyncio.to_thread(run)
    statuses = {case: data.split(b"\r\n")[0].decode() for case, data in answers.items()}
    expected = dict.fromkeys(heads, "HTTP/1.1 400 Bad Request")
    expected["huge head"] = "HTTP/1.1 431 Request Header Fields Too Large"
    assert statuses == expected
    # Only the malformed chunked body's head was forwarded (its body fails while it is relayed), and the upstream
    # never got a complete request from it.
    assert up.seen == []
    no_secret(*answers.values())


async def test_a_credential_that_would_inject_a_header_is_never_sent(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    for bad in (credential(value="x\r\nX-Injected: 1"), credential(header="Host"), credential(header="Bad Name")):
        async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
            broker, bad, {HOST: up.port}
        ) as front:
            context = client_context(broker.session_ca_pem(front.session_id))

            def run(front_port: int = front.port, port: int = up.port, context: ssl.SSLContext = context) -> bytes:
                return exchange(tunnel(front_port, HOST, port, context),
                                f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())

            received = await asyncio.to_thread(run)
        assert received.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
        assert up.connections == 0


def test_an_unreadable_upstream_ca_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError, match="upstream_ca"):
        CredentialBroker(bad)
    with pytest.raises(ConfigError, match="upstream_ca"):
        CredentialBroker(tmp_path / "missing.pem")
