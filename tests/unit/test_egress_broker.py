"""The credential broker relaying requests between real clients (http.client, urllib, curl, raw TLS) and real TLS
servers on 127.0.0.1 with the test's own CA: the credential reaches the upstream on every request, bodies pass
intact both ways, upstream connections are reused only when safe, and the byte budget cuts a transfer."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import os
import shutil
import ssl
import time
import urllib.request
from pathlib import Path

import pytest

from controlplane.egress_proxy.broker import CredentialBroker
from controlplane.egress_proxy.types import ByteMeter, Credential, EgressBudgetError
from tests.unit.egress_tls import (
    HOST,
    SECRET,
    Front,
    LoopbackCa,
    Seen,
    Upstream,
    client_context,
    credential,
    exchange,
    no_secret,
    routes,
    sized,
    tunnel,
)
from tests.unit.tools.web_support import Guard


@pytest.fixture
def test_ca(tmp_path: Path) -> LoopbackCa:
    return LoopbackCa(tmp_path)


async def test_the_credential_reaches_the_upstream_in_place_of_the_clients_own(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        ca = broker.session_ca_pem(front.session_id)

        def run() -> bytes:
            sock = tunnel(front.port, HOST, up.port, client_context(ca))
            request = f"GET /hello HTTP/1.1\r\nHost: {HOST}:{up.port}\r\nauthorization: Bearer forged\r\n"
            return exchange(sock, (request + "AUTHORIZATION: Basic also-forged\r\nConnection: close\r\n\r\n").encode())

        received = await asyncio.to_thread(run)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"hello")
    [seen] = up.seen
    assert seen.header("authorization") == [SECRET]
    assert seen.header("host") == [f"{HOST}:{up.port}"]
    no_secret(received)


async def test_the_broker_resolves_nothing_and_connects_only_to_the_vetted_address(
    test_ca: LoopbackCa, guard: Guard
) -> None:
    """On asyncio's own loop (the guard records its lookups and connections): the host name is only ever the
    certificate's name, never looked up."""
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            sock = tunnel(front.port, HOST, up.port, context)
            return exchange(sock, f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())

        received = await asyncio.to_thread(run)
    assert received.endswith(b"hello")
    assert guard.connections == ["127.0.0.1"]
    assert not any(HOST in name for name in guard.lookups)


async def test_every_request_on_a_kept_alive_connection_carries_it_pipelined_too(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential("X-Api-Key", SECRET), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> list[bytes]:
            conn = http.client.HTTPSConnection("127.0.0.1", front.port, context=context)
            conn.set_tunnel(HOST, up.port)
            bodies = []
            for _ in range(3):
                conn.request("GET", "/hello", headers={"X-Api-Key": "forged"})
                response = conn.getresponse()
                bodies.append(response.read())
            conn.close()
            sock = tunnel(front.port, HOST, up.port, context)
            one = f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n"
            two = f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
            bodies.append(exchange(sock, (one + two).encode()))
            return bodies

        bodies = await asyncio.to_thread(run)
    assert bodies[:3] == [b"hello"] * 3
    assert bodies[3].count(b"HTTP/1.1 200 OK") == 2
    assert [seen.header("x-api-key") for seen in up.seen] == [[SECRET]] * 5
    assert up.connections == 2, "the kept-alive client connection reused one upstream connection"
    no_secret(*bodies)


async def test_urllib_through_the_proxy_trusting_a_bundle_file(test_ca: LoopbackCa, tmp_path: Path) -> None:
    """What a tool does with SSL_CERT_FILE pointing at a bundle that holds the session's CA."""
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        bundle = tmp_path / "bundle.pem"
        bundle.write_bytes(broker.session_ca_pem(front.session_id))
        context = ssl.create_default_context(cafile=str(bundle))
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"https": f"http://127.0.0.1:{front.port}"}),
            urllib.request.HTTPSHandler(context=context),
        )

        def run() -> bytes:
            with opener.open(f"https://{HOST}:{up.port}/hello", timeout=10) as response:
                return bytes(response.read())

        body = await asyncio.to_thread(run)
    assert body == b"hello"
    assert up.seen[0].header("authorization") == [SECRET]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (Debian's curl package)")
async def test_curl_through_the_proxy_speaks_http11_and_its_chunked_upload_arrives(
    test_ca: LoopbackCa, tmp_path: Path
) -> None:
    """curl offers h2 first (it is built with nghttp2): the broker's ALPN keeps it on HTTP/1.1."""
    broker = CredentialBroker(test_ca.ca_file)
    payload = os.urandom(200_000)
    (tmp_path / "upload").write_bytes(payload)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        (tmp_path / "session-ca.pem").write_bytes(broker.session_ca_pem(front.session_id))
        curl = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--fail", "--proxy", f"http://127.0.0.1:{front.port}", "--cacert",
            str(tmp_path / "session-ca.pem"), "-H", "Authorization: Bearer forged", "-H", "Transfer-Encoding: chunked",
            "--data-binary", f"@{tmp_path / 'upload'}", "-o", str(tmp_path / "download"), "-w", "%{http_version}",
            f"https://{HOST}:{up.port}/echo",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": os.environ["PATH"]},
        )
        out, err = await asyncio.wait_for(curl.communicate(), 30)
    assert curl.returncode == 0, err
    assert out == b"1.1"
    assert (tmp_path / "download").read_bytes() == payload
    assert up.seen[0].body == payload
    assert up.seen[0].header("authorization") == [SECRET]


async def test_an_ip_literal_host_gets_a_leaf_with_its_address(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context("127.0.0.1"), routes()) as up, Front(
        broker, Credential("127.0.0.1", "Authorization", SECRET), {"127.0.0.1": up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            sock = tunnel(front.port, "127.0.0.1", up.port, context)
            return exchange(sock, f"GET /hello HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\nConnection: close\r\n\r\n"
                            .encode())

        received = await asyncio.to_thread(run)
    assert received.endswith(b"hello")
    assert up.seen[0].header("authorization") == [SECRET]


async def test_chunked_bodies_pass_intact_both_ways_with_100_continue(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    payload = os.urandom(300_000)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> tuple[bytes, str | None, bytes]:
            conn = http.client.HTTPSConnection("127.0.0.1", front.port, context=context)
            conn.set_tunnel(HOST, up.port)
            pieces = [payload[i:i + 70_001] for i in range(0, len(payload), 70_001)]
            conn.request("POST", "/echo", body=iter(pieces), encode_chunked=True)
            response = conn.getresponse()
            body = response.read()
            trailer_encoding = response.getheader("transfer-encoding")
            conn.close()
            sock = tunnel(front.port, HOST, up.port, context)
            raw = (f"PUT /echo HTTP/1.1\r\nHost: {HOST}\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n"
                   "Connection: close\r\n\r\n5;name=x\r\nhello\r\n0\r\nX-Sum: 5\r\nAuthorization: forged\r\n\r\n")
            return body, trailer_encoding, exchange(sock, raw.encode())

        body, encoding, raw_reply = await asyncio.to_thread(run)
    assert hashlib.sha256(body).digest() == hashlib.sha256(payload).digest()
    assert encoding == "chunked"
    assert up.seen[0].body == payload
    assert up.seen[0].header("transfer-encoding") == ["chunked"]
    assert raw_reply.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert raw_reply.endswith(b"1\r\nh\r\n3\r\nell\r\n1\r\no\r\n0\r\nX-Done: yes\r\n\r\n")
    assert up.seen[1].body == b"hello"
    assert up.seen[1].trailer == [("X-Sum", "5")], "a trailer naming the credential's header is dropped"
    assert up.seen[1].header("authorization") == [SECRET]


async def test_a_response_delimited_by_close_is_relayed_then_the_client_closed(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            return exchange(tunnel(front.port, HOST, up.port, context),
                            f"GET /close HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())

        received = await asyncio.to_thread(run)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"\r\n\r\nall of it, then close")


async def test_an_upstream_that_closed_an_idle_connection_is_reopened_for_the_next_request(
    test_ca: LoopbackCa,
) -> None:
    async def once(_seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nonce")
        return False  # closes the connection without saying so

    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), {"/once": once}) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> tuple[bytes, bytes]:
            with tunnel(front.port, HOST, up.port, context) as sock:
                sock.sendall(f"GET /once HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
                first = b""
                while not first.endswith(b"once"):
                    first += sock.recv(65536)
                time.sleep(0.3)
                second = exchange(sock, f"GET /once HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
                                  .encode())
            return first, second

        first, second = await asyncio.to_thread(run)
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert second.startswith(b"HTTP/1.1 200 OK\r\n")
    assert up.connections == 2
    assert [seen.header("authorization") for seen in up.seen] == [[SECRET]] * 2


async def test_bytes_an_upstream_sends_past_its_answer_are_never_read_as_the_next_answer(
    test_ca: LoopbackCa,
) -> None:
    """The test upstream writes a body even for HEAD (a broken server): the broker ends the HEAD answer at its
    head, drops the connection holding the stray bytes, and answers the next request from a new one."""
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            head = f"HEAD /hello HTTP/1.1\r\nHost: {HOST}\r\n\r\n"
            get = f"GET /hello HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
            return exchange(tunnel(front.port, HOST, up.port, context), (head + get).encode())

        received = await asyncio.to_thread(run)
    assert received == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    )
    assert up.connections == 2


async def test_an_http10_client_gets_the_host_and_one_request_per_connection(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            return exchange(tunnel(front.port, HOST, up.port, context), b"GET /hello HTTP/1.0\r\n\r\n")

        received = await asyncio.to_thread(run)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.endswith(b"hello")
    [seen] = up.seen
    assert seen.header("host") == [f"{HOST}:{up.port}"]
    assert seen.header("authorization") == [SECRET]
    assert seen.header("connection") == ["close"]


async def test_the_byte_budget_cuts_a_large_response(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    budget = 1 << 20
    async with Upstream(test_ca.server_context(HOST), {"/big": sized(8 << 20)}) as up, Front(
        broker, credential(), {HOST: up.port}, meter=ByteMeter(budget)
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            return exchange(tunnel(front.port, HOST, up.port, context),
                            f"GET /big HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())

        received = await asyncio.to_thread(run)
        for _ in range(100):
            if front.errors:
                break
            await asyncio.sleep(0.02)
    assert received.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 8388608\r\n")
    assert len(received) <= budget, "nothing past the budget reached the client"
    assert len(received) > budget // 2
    assert [type(error) for error in front.errors] == [EgressBudgetError]
    assert budget < front.meter.total < budget + 70_000


async def test_the_byte_budget_cuts_a_large_upload_before_the_upstream_has_it(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    budget = 256 << 10
    async with Upstream(test_ca.server_context(HOST), routes()) as up, Front(
        broker, credential(), {HOST: up.port}, meter=ByteMeter(budget)
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))

        def run() -> bytes:
            sock = tunnel(front.port, HOST, up.port, context)
            got = b""
            with sock:
                try:
                    sock.sendall(f"POST /hello HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {4 << 20}\r\n\r\n".encode())
                    for _ in range(64):
                        sock.sendall(b"u" * 65536)
                except (ssl.SSLError, OSError):
                    pass
                with contextlib.suppress(ssl.SSLError, OSError):
                    got = sock.recv(65536)
            return got

        received = await asyncio.to_thread(run)
        for _ in range(100):
            if front.errors:
                break
            await asyncio.sleep(0.02)
    assert [type(error) for error in front.errors] == [EgressBudgetError]
    assert received == b"", "the connection was cut, not answered"
    assert up.seen == [], "the upstream never had the whole body"
    assert budget < front.meter.up < budget + 70_000


async def test_cancelling_an_intercepted_connection_cuts_both_sides(test_ca: LoopbackCa) -> None:
    """What the session proxy's close does to a connection in the middle of an answer."""
    upstream_cut = asyncio.Event()

    async def stalls(_seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
        await writer.drain()
        transport = writer.transport
        for _ in range(500):
            if transport.is_closing():
                upstream_cut.set()
                break
            await asyncio.sleep(0.01)
        return False

    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), {"/stalls": stalls}) as up, Front(
        broker, credential(), {HOST: up.port}
    ) as front:
        context = client_context(broker.session_ca_pem(front.session_id))
        sock = await asyncio.to_thread(tunnel, front.port, HOST, up.port, context)
        with sock:
            sock.sendall(f"GET /stalls HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            got = b""
            while not got.endswith(b"part"):
                got += await asyncio.to_thread(sock.recv, 65536)
            for _ in range(100):
                if front.tasks:
                    break
                await asyncio.sleep(0.01)
            for task in front.tasks:
                task.cancel()

            def rest() -> bytes:
                more = b""
                while chunk := sock.recv(65536):
                    more += chunk
                return more

            assert await asyncio.wait_for(asyncio.to_thread(rest), 10) == b"", "the client was cut mid-answer"
        await asyncio.wait_for(upstream_cut.wait(), 10)


async def test_concurrent_connections_of_two_sessions_each_carry_the_credential(test_ca: LoopbackCa) -> None:
    broker = CredentialBroker(test_ca.ca_file)
    async with Upstream(test_ca.server_context(HOST), routes()) as up:
        fronts = [Front(broker, credential(), {HOST: up.port}, session_id=name) for name in ("a", "b")]
        async with fronts[0] as one, fronts[1] as two:

            def client(front: Front) -> list[bytes]:
                context = client_context(broker.session_ca_pem(front.session_id))
                conn = http.client.HTTPSConnection("127.0.0.1", front.port, context=context, timeout=20)
                conn.set_tunnel(HOST, up.port)
                bodies = []
                for _ in range(5):
                    conn.request("GET", "/hello")
                    bodies.append(conn.getresponse().read())
                conn.close()
                return bodies

            results = await asyncio.gather(*(asyncio.to_thread(client, front) for front in [one, two] * 8))
    assert results == [[b"hello"] * 5] * 16
    assert len(up.seen) == 80
    assert all(seen.header("authorization") == [SECRET] for seen in up.seen)
