"""The agent's egress forwarder (sandbox_agent.egress_forwarder): a TCP listener on loopback relaying each
connection to the proxy's Unix socket, and the environment and CA bundle tools get with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox_agent.egress_forwarder import EgressForwarder, NetworkStartError, proxy_env, write_ca_bundle


@contextlib.asynccontextmanager
async def unix_server(path: Path, seen: list[bytes]) -> AsyncIterator[asyncio.Server]:
    """Stands in for the proxy's socket: records what arrives, answers `got:` + it once the client half-closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        seen.append(data)
        writer.write(b"got:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, str(path))
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()


async def exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()  # the relay passes the half-close on, so the far side sees the end of the request
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_each_connection_is_relayed_both_ways_to_the_socket(tmp_path: Path) -> None:
    seen: list[bytes] = []
    big = os.urandom(1024 * 1024)
    async with unix_server(tmp_path / "egress.sock", seen):
        forwarder = EgressForwarder(str(tmp_path / "egress.sock"))
        port = await forwarder.start(0)
        try:
            answers = await asyncio.gather(exchange(port, b"CONNECT a.test:443 HTTP/1.1\r\n\r\n"), exchange(port, big))
        finally:
            await forwarder.close()
    assert list(answers) == [b"got:CONNECT a.test:443 HTTP/1.1\r\n\r\n", b"got:" + big]
    assert sorted(seen, key=len) == [b"CONNECT a.test:443 HTTP/1.1\r\n\r\n", big]


async def test_without_the_proxy_a_client_sees_a_closed_connection(tmp_path: Path) -> None:
    forwarder = EgressForwarder(str(tmp_path / "absent.sock"))
    port = await forwarder.start(0)
    try:
        assert await exchange(port, b"GET http://a.test/ HTTP/1.1\r\n\r\n") == b""
    finally:
        await forwarder.close()


async def test_connections_past_the_cap_wait_for_a_slot(tmp_path: Path) -> None:
    held = asyncio.Event()
    opened = 0

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        opened += 1
        await held.wait()
        writer.close()

    server = await asyncio.start_unix_server(hold, str(tmp_path / "egress.sock"))
    forwarder = EgressForwarder(str(tmp_path / "egress.sock"), max_connections=2)
    port = await forwarder.start(0)
    clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        await asyncio.sleep(0.3)
        assert opened == 2
        held.set()
        for _, writer in clients[:2]:
            writer.close()
        for _ in range(50):
            if opened == 3:
                break
            await asyncio.sleep(0.05)
        assert opened == 3
    finally:
        held.set()
        for _, writer in clients:
            writer.close()
        await forwarder.close()
        server.close()


async def test_a_second_start_and_a_taken_port_are_refused(tmp_path: Path) -> None:
    first = EgressForwarder(str(tmp_path / "egress.sock"))
    port = await first.start(0)
    second = EgressForwarder(str(tmp_path / "egress.sock"))
    try:
        with pytest.raises(NetworkStartError, match="already started"):
            await first.start(0)
        with pytest.raises(NetworkStartError, match=f"cannot listen on 127.0.0.1:{port}"):
            await second.start(port)
    finally:
        await first.close()
        await second.close()


def test_the_environment_names_the_forwarder_and_the_bundle_only_when_given_one() -> None:
    plain = proxy_env(3128, None)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy",
                 "npm_config_https_proxy"):
        assert plain[name] == "http://127.0.0.1:3128"
    assert plain["NO_PROXY"] == plain["no_proxy"] == "localhost,127.0.0.1,::1"
    assert "SSL_CERT_FILE" not in plain
    with_ca = proxy_env(3128, "/tmp/b.pem")
    assert {with_ca[n] for n in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO",
                                 "NODE_EXTRA_CA_CERTS")} == {"/tmp/b.pem"}


def test_the_bundle_holds_the_system_cas_then_the_session_ca(tmp_path: Path) -> None:
    system = tmp_path / "system.pem"
    system.write_bytes(b"-----SYSTEM-----\n")
    path = write_ca_bundle(b"-----SESSION-----\n", str(tmp_path), str(system))
    again = write_ca_bundle(b"-----RENEWED-----\n", str(tmp_path), str(system))
    assert Path(path).read_bytes() == b"-----SYSTEM-----\n\n-----SESSION-----\n"
    assert Path(path).stat().st_mode & 0o777 == 0o644
    assert again != path
    assert Path(again).parent == tmp_path
