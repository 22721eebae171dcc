"""The plane reaches an agent's Unix socket through the inode it found there, never through what the name leads to
later: the socket's dir is the sandbox's, and a compromised agent (root in its container) could put a symlink to
another sandbox's agent in its place."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controlplane.errors import SandboxError
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from sandbox.v1 import agent_pb2
from sandbox_agent.stdin_credit import FEATURES


class _Agent:
    """An agent's Health alone (what the client asks first), naming itself."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.asked = 0

    async def health(self, request: agent_pb2.HealthRequest, context: object) -> agent_pb2.HealthResponse:
        self.asked += 1
        return agent_pb2.HealthResponse(version=self.version, flow_control=FEATURES)  # as this tree's agent


async def _serve(path: Path, agent: _Agent) -> grpc.aio.Server:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        agent.health, request_deserializer=agent_pb2.HealthRequest.FromString,
        response_serializer=agent_pb2.HealthResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("sandbox.v1.SandboxAgent",
                                                                           {"Health": handler})])
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


@pytest.fixture
async def other(tmp_path: Path) -> AsyncIterator[tuple[Path, _Agent]]:
    """Another sandbox's agent, answering on its own socket."""
    agent = _Agent("other")
    path = tmp_path / "other.sock"
    server = await _serve(path, agent)
    yield path, agent
    await server.stop(None)


async def test_a_link_in_the_sockets_place_is_never_followed(tmp_path: Path, other: tuple[Path, _Agent]) -> None:
    path = tmp_path / "agent.sock"
    os.symlink(other[0], path)
    client = GrpcSandboxAgent(f"unix:{path}", "sbx")
    with pytest.raises(SandboxError, match="not a socket"):
        await client.health(timeout_s=1.0)
    await client.close()
    assert other[1].asked == 0


async def test_a_reconnect_goes_to_the_socket_first_found_not_to_a_link_put_there_later(
    tmp_path: Path, other: tuple[Path, _Agent]
) -> None:
    path = tmp_path / "agent.sock"
    own = _Agent("own")
    server = await _serve(path, own)
    client = GrpcSandboxAgent(f"unix:{path}", "sbx")
    assert (await client.health(timeout_s=5.0)).version == "own"
    await server.stop(None)  # the connection drops (and gRPC removes the socket's name): the next call connects again
    path.unlink(missing_ok=True)
    os.symlink(other[0], path)  # a link to the other agent in the socket's place
    with pytest.raises(SandboxError):
        await client.health(timeout_s=2.0)
    await client.close()
    assert other[1].asked == 0


async def test_a_socket_that_appears_later_is_waited_for(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    client = GrpcSandboxAgent(f"unix:{path}", "sbx")
    with pytest.raises(SandboxError, match="no socket"):
        await client.health(timeout_s=0.05)
    server = await _serve(path, _Agent("late"))
    assert (await client.health(timeout_s=5.0)).version == "late"
    await client.close()
    await server.stop(None)
