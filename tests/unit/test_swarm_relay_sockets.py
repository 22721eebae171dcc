"""The Swarm relay reaches a sandbox's agent through the socket it found at its first connect: a compromised agent
(root in its container, which writes its socket dir) that puts a link to another sandbox's socket in its place,
before the first connect or between two, never has the plane's connection spliced to that other agent. The real
Relay, served on a Unix socket (its TLS front is the plane's authentication, not what is tested)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.sandbox.swarm.relay import EgressPoint, Relay
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


async def _relay(root: Path, *sandboxes: str) -> tuple[Relay, asyncio.Server, list[Path]]:
    """The relay of node "node", served on ROOT/front.sock, and the dirs of `sandboxes` of instance "inst"."""
    dirs = [root / "node" / "inst" / name for name in sandboxes]
    for directory in dirs:
        directory.mkdir(parents=True)
    relay = Relay(root, "node")
    return relay, await asyncio.start_unix_server(relay.handle, str(root / "front.sock")), dirs


async def _connect(front: Path, sandbox: str) -> tuple[dict[str, object], bytes]:
    reader, writer = await asyncio.open_unix_connection(str(front))
    writer.write(json.dumps({"op": "connect", "instance": "inst", "sandbox": sandbox}).encode() + b"\n")
    await writer.drain()
    reply = json.loads(await reader.readline())
    reached = await reader.readline() if reply.get("ok") else b""
    writer.close()
    return reply, reached


async def test_a_link_in_the_sockets_place_is_not_followed_before_or_after_the_first_connect(root: Path) -> None:
    relay, front, (mine, other, third) = await _relay(root, "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc")
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


async def test_an_agent_restarted_in_its_dir_is_reached_through_its_new_socket(root: Path) -> None:
    relay, front, (mine, other) = await _relay(root, "aaaaaaaaaaaa", "bbbbbbbbbbbb")
    first, another = await _agent(mine, "first"), await _agent(other, "another tenant's")
    servers = [first, another]
    try:
        assert await _connect(root / "front.sock", "aaaaaaaaaaaa") == ({"ok": True}, b"first\n")
        first.close()  # the agent restarts: its socket is bound anew under the same name
        await first.wait_closed()
        os.unlink(mine / "agent.sock")
        servers.append(await _agent(mine, "restarted"))
        assert await _connect(root / "front.sock", "aaaaaaaaaaaa") == ({"ok": True}, b"restarted\n")
        # A dead socket is given up only for a socket: a link in its place is still refused.
        servers[-1].close()
        await servers[-1].wait_closed()
        os.unlink(mine / "agent.sock")
        os.symlink(other / "agent.sock", mine / "agent.sock")
        reply, reached = await _connect(root / "front.sock", "aaaaaaaaaaaa")
        assert reply["ok"] is False
        assert reached == b""
        assert mine not in relay.pinned
    finally:
        for server in servers:
            server.close()
        front.close()


async def test_the_egress_socket_is_private_from_its_bind_and_no_swapped_link_is_followed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = root / "node" / "inst" / "aaaaaaaaaaaa"
    directory.mkdir(parents=True)
    victim = root / "victim"  # a file of the node the sandbox's agent would like opened to it
    victim.write_text("node's")
    victim.chmod(0o644)
    real_start = asyncio.start_unix_server

    async def start_then_swap(*args: Any, **kwargs: Any) -> asyncio.Server:
        # The agent (which writes its dir) wins the race: right after the bind, the name is a link to the victim.
        server = await real_start(*args, **kwargs)
        os.rename(directory / "egress.sock", directory / "bound.sock")
        os.symlink(victim, directory / "egress.sock")
        return server

    monkeypatch.setattr(asyncio, "start_unix_server", start_then_swap)
    point = EgressPoint(directory / "egress.sock")
    try:
        await point.listen()
        assert stat.S_IMODE(victim.stat().st_mode) == 0o644
        assert stat.S_IMODE(os.lstat(directory / "bound.sock").st_mode) == 0o600
    finally:
        point.close()
