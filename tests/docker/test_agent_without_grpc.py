"""Which agents load grpc: a Docker-provider agent serves its RPCs as frames only and never imports grpc (an idle
sandbox's memory and wake-ups: sandbox_agent/serving.py), while an agent asked for gRPC (AGENT_GRPC=1, as the Swarm
provider's relay needs) still answers it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import allow_once
from controlplane.sandbox import confinement
from controlplane.sandbox.layout import ENV_GRPC, agent_env
from sandbox.v1 import agent_pb2, agent_pb2_grpc
from tests.archives import tar_of
from tests.faults.sandboxes import agent_host_pid, container_of
from tests.planes import Plane, short_tmp
from tests.runtimes import IMAGE

pytestmark = pytest.mark.docker
HARDENED: dict[str, Any] = {
    "user": "0:0", "init": True, "network_mode": "none", "cap_drop": ["ALL"], "cap_add": ["SETUID", "SETGID", "KILL"],
    "security_opt": ["no-new-privileges"], "read_only": True, "tmpfs": {"/tmp": "rw,size=16m"}, "detach": True,
}


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


async def test_a_docker_agent_serves_frames_only_and_never_loads_grpc(docker_plane: Plane) -> None:
    client = docker_plane.client
    session = await client.create_session(workspace_archive=tar_of({"a.txt": "alpha\n"}))
    try:
        read = await client.execute_tool(session.id, "read", {"filePath": "/workspace/a.txt"}, on_permission=allow_once)
        assert "1: alpha" in read.output
        done = await client.run(session.id, ["cat", "a.txt"])
        assert done.stdout == b"alpha\n"
        assert [e.path for e in (await client.list_files(session.id, "")).entries] == ["a.txt"]
        sockets = docker_plane.plane.settings.data_dir / "sandboxes" / session.sandbox_id
        assert sorted(p.name for p in sockets.iterdir() if p.is_socket()) == ["frames.sock"]
        pid = agent_host_pid(container_of(docker_plane.instance, session.sandbox_id))
        maps = _maps(pid)
        assert "python3" in maps  # the positive control: this is the agent's map
        assert "cygrpc" not in maps
        assert "grpc" not in maps
    finally:
        await client.delete_session(session.id)


async def test_an_agent_asked_for_grpc_answers_grpc_beside_frames() -> None:
    engine = docker.from_env()
    agent_dir = short_tmp()
    container = engine.containers.run(
        IMAGE, environment=agent_env() | confinement.agent_env(200_024) | {ENV_GRPC: "1"},
        mounts=[docker.types.Mount("/run/agent", str(agent_dir), type="bind")],
        labels={"ocsb.managed": "test-agent-without-grpc"}, **HARDENED)
    try:
        for _ in range(400):
            if (agent_dir / "agent.sock").is_socket():
                break
            await asyncio.sleep(0.05)
        assert sorted(p.name for p in agent_dir.iterdir()) == ["agent.sock", "frames.sock"]
        channel = grpc.aio.insecure_channel(f"unix:{agent_dir / 'agent.sock'}")
        try:
            stub = agent_pb2_grpc.SandboxAgentStub(channel)
            health = await stub.Health(agent_pb2.HealthRequest(), timeout=20, wait_for_ready=True)
            assert health.workspace == "/workspace"
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.ListFiles(agent_pb2.ListFilesRequest(path="missing"), timeout=20)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            await channel.close()
        container.reload()
        assert "cygrpc" in _maps(agent_host_pid(container))
    finally:
        container.remove(force=True)
        shutil.rmtree(agent_dir, ignore_errors=True)
