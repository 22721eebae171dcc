"""The Swarm relay reaches a sandbox's agent through the socket it found at its first connect: a compromised agent
(root in its container, which writes its socket dir) that puts a link to another sandbox's socket in its place,
before the first connect or between two, never has the plane's connection spliced to that other agent. The real
Relay, served on a Unix socket (its TLS front is the plane's authentication, not what is tested)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.sandbox.swarm.relay import Relay
from tests.planes import short_tmp


async def _agent(directory: Path, says: str) -> asyncio.Server:
    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(says.encode() + b"\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(answer, str(directory / "agent.sock"))


@pytest.fixture
async def root() -> AsyncIterator[Path]:
    made = short_tmp()
    try:
        yield made
    finally:
        for path in sorted(made.rglob("*"), reverse=True):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        made.rmdir()


async def _connect(front: Path, sandbox: str) -> tuple[dict[str, object], bytes]:
    reader, writer = await asyncio.open_unix_connection(str(front))
    writer.write(json.dumps({"op": "connect", "instance": "inst", "sandbox": sandbox}).encode() + b"\n")
    await writer.drain()
    reply = json.loads(await reader.readline())
    reached = await reader.readline() if reply.get("ok") else b""
    writer.close()
    return reply, reached


async def test_a_link_in_the_sockets_place_is_not_followed_before_or_after_the_first_connect(root: Path) -> None:
    mine, other, third = (root / "node" / "inst" / name for name in ("aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"))
    for directory in (mine, other, third):
        directory.mkdir(parents=True)
    relay = Relay(root, "node")
    front = await asyncio.start_unix_server(relay.handle, str(root / "front.sock"))
    servers = [await _agent(mine, "mine"), await _agent(other, "another tenant's")]
    try:
        # After a first connect: the name is swapped for a link to the other sandbox's socket.
        assert await _connect(root / "front.sock", "aaaaaaaaaaaa") == ({"ok": True}, b"mine\n")
        os.unlink(mine / "agent.sock")
        os.symlink(other / "agent.sock", mine / "agent.sock")
        reply, reached = await _connect(root / "front.sock", "aaaaaaaaaaaa")
        assert reached != b"another tenant's\n"
        # Before any connect: the link is refused.
        os.symlink(other / "agent.sock", third / "agent.sock")
        reply, reached = await _connect(root / "front.sock", "cccccccccccc")
        assert reply["ok"] is False
        assert "agent socket" in str(reply["error"])
        assert reached == b""
        # Its removal forgets the pinned socket (the descriptor is closed).
        pinned = relay.pinned[mine]
        assert relay._control("remove", {"instance": "inst", "sandbox": "aaaaaaaaaaaa"}) == {"ok": True}
        assert mine not in relay.pinned
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(pinned)
    finally:
        for server in servers:
            server.close()
        front.close()
