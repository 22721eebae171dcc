"""The Swarm relay's `egress` op and the control plane's EgressLink, in one process over real mutual TLS (the
relay's own PKI): a connection to a sandbox dir's egress.sock arrives at the Unix socket the link serves (where
the session proxy listens), each on a stream of its own; nothing is carried without the control plane's streams,
for a dir the relay did not prepare, or after the dir is removed. The real cluster: tests/cluster/test_swarm_egress.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.sandbox.swarm import relay as relay_module
from controlplane.sandbox.swarm.channel import LocalForward, RelayClient, RelayPki
from controlplane.sandbox.swarm.relay import Relay, server_context
from tests.planes import short_tmp


@dataclass
class Node:
    relay: Relay
    client: RelayClient
    root: Path

    def egress_sock(self, sandbox: str) -> Path:
        return self.root / "node1" / "inst" / sandbox / "egress.sock"


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    tmp = short_tmp()
    pki = RelayPki.ensure(tmp / "pki")
    relay = Relay(tmp / "root", "node1")
    server = await asyncio.start_server(
        relay.handle, "127.0.0.1", 0, ssl=server_context(str(pki.server_cert), str(pki.server_key), str(pki.ca)),
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield Node(relay, RelayClient("127.0.0.1", port, pki.client_context()), tmp / "root")
    finally:
        server.close()
        for point in relay.egress.values():
            point.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def echo_upper(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Stands where the session proxy listens: answers each line in capitals, so the test sees a round trip."""
    while line := await reader.readline():
        writer.write(line.upper())
        await writer.drain()
    writer.close()


async def ask(path: Path, text: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(text.encode() + b"\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def forward_with_proxy(node: Node, sandbox: str, tmp: Path) -> AsyncIterator[tuple[LocalForward, Path]]:
    await node.client.request({"op": "prepare", "instance": "inst", "sandbox": sandbox})
    forward = LocalForward(tmp / "fwd" / f"{sandbox}.sock", node.client, "inst", sandbox)
    await forward.start()
    proxy_path = forward.carry_egress()
    server = await asyncio.start_unix_server(echo_upper, str(proxy_path))
    try:
        yield forward, proxy_path
    finally:
        server.close()
        await forward.close()


async def wait_for_socket(path: Path) -> None:
    for _ in range(200):
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


async def test_connections_to_egress_sock_reach_the_proxy_socket_each_on_its_own_stream(node: Node) -> None:
    tmp = short_tmp()
    try:
        async with forward_with_proxy(node, "sb1", tmp) as (_, proxy_path):
            assert proxy_path == tmp / "fwd" / "sb1.egress.sock"
            sock = node.egress_sock("sb1")
            await wait_for_socket(sock)
            # More at once than the link keeps waiting: the rest wait for replacements, none is lost or mixed.
            answers = await asyncio.gather(*(ask(sock, f"hello {i}") for i in range(12)))
            assert answers == [f"HELLO {i}\n".encode() for i in range(12)]
            assert oct(sock.stat().st_mode & 0o777) == oct(0o600)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def test_without_the_control_planes_streams_nothing_is_carried(
    node: Node, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay_module, "EGRESS_WAIT_S", 0.5)
    tmp = short_tmp()
    try:
        async with forward_with_proxy(node, "sb2", tmp) as (forward, _):
            sock = node.egress_sock("sb2")
            await wait_for_socket(sock)
            assert await ask(sock, "first") == b"FIRST\n"
            await forward.close()  # the plane stops: its waiting streams go
            assert await ask(sock, "second") == b""  # closed once no stream came
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def test_an_unprepared_or_removed_dir_gets_no_egress_socket(node: Node) -> None:
    with pytest.raises(ConnectionError, match="not prepared"):
        await node.client.connect("inst", "nosuch", "egress")
    assert not node.egress_sock("nosuch").exists()
    tmp = short_tmp()
    try:
        async with forward_with_proxy(node, "sb3", tmp):
            sock = node.egress_sock("sb3")
            await wait_for_socket(sock)
            await node.client.request({"op": "remove", "instance": "inst", "sandbox": "sb3"})
            assert not sock.exists()
            assert node.relay.egress == {}
            with pytest.raises(ConnectionError, match="not prepared"):
                await node.client.connect("inst", "sb3", "egress")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def test_a_bad_sandbox_name_is_refused(node: Node) -> None:
    with pytest.raises(ConnectionError, match="bad instance or sandbox name"):
        await node.client.connect("inst", "../other", "egress")
