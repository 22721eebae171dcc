"""The agent's StartNetwork (in-process agent): the forwarder relays to the proxy's socket beside the agent's,
every command started afterwards has the proxy's environment, nothing before it does, and a second call (a
restarted plane adopting the session) keeps the forwarder and renews the CA bundle."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.core.seam.messages import CommandSpec, Exited, Output
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from tests.local_agent import local_agent


@pytest.fixture
async def agent() -> AsyncIterator[tuple[GrpcSandboxAgent, Path]]:
    async with local_agent("agent.sock") as (client, _, root):
        yield client, root


async def run(agent: GrpcSandboxAgent, command: str) -> str:
    stream = await agent.exec(CommandSpec(argv=[], command=command, env={}, cwd="", timeout_ms=20_000,
                                          stdin=False, merge_stderr=True))
    out = b""
    async for event in stream.events():
        if isinstance(event, Output):
            out += event.data
        elif isinstance(event, Exited):
            break
    return out.decode()


async def test_commands_get_the_proxy_only_after_the_network_starts(agent: tuple[GrpcSandboxAgent, Path]) -> None:
    client, root = agent
    assert "proxy" not in (await run(client, "env")).lower()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        body = b"proxied " + head.split(b" ")[1]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    # The proxy's place, as the plane's SessionProxy takes it: `egress.sock` beside the agent's socket.
    proxy = await asyncio.start_unix_server(answer, str(root / "egress.sock"))
    try:
        env = await client.start_network(0, b"")
        port = int(env["HTTP_PROXY"].rsplit(":", 1)[1])
        assert port > 0
        assert env["no_proxy"] == "localhost,127.0.0.1,::1"
        assert "SSL_CERT_FILE" not in env
        shown = await run(client, "env")
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "npm_config_proxy"):
            assert f"{name}={env[name]}\n" in shown
        # A client that honours the variables reaches the proxy through the forwarder (the name is never resolved
        # here: the proxy resolves).
        fetched = await run(client, "python3 -c \"import urllib.request as u; "
                                    "print(u.urlopen('http://pkgs.test/simple/', timeout=10).read().decode())\"")
        assert fetched.strip() == "proxied http://pkgs.test/simple/"

        renewed = await client.start_network(0, b"-----BEGIN CERTIFICATE-----\nsession\n")
        assert renewed["HTTP_PROXY"] == env["HTTP_PROXY"]  # the same forwarder
        bundle = renewed["SSL_CERT_FILE"]
        try:
            written = Path(bundle).read_bytes()  # noqa: ASYNC240 - one small local file
            assert written.endswith(b"-----BEGIN CERTIFICATE-----\nsession\n")
            assert f"GIT_SSL_CAINFO={bundle}\n" in await run(client, "env")
        finally:
            os.unlink(bundle)
    finally:
        proxy.close()
