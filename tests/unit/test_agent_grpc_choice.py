"""Which agents serve gRPC: only those their provider asks (AGENT_GRPC=1, the Swarm task, whose relay carries gRPC);
an agent's own config reads that from its environment, and a Docker agent's environment does not ask."""

from __future__ import annotations

from controlplane.config import SwarmProviderConfig
from controlplane.core.sessions.models import Resources
from controlplane.sandbox import confinement
from controlplane.sandbox.layout import ENV_GRPC, agent_env
from controlplane.sandbox.swarm.service import sandbox_template
from sandbox_agent.config import AgentConfig


def test_the_swarm_task_asks_its_agent_for_grpc() -> None:
    resources = Resources(cpu=1.0, memory_mb=512, pids=256)
    template = sandbox_template(SwarmProviderConfig(), {}, "/run/x", 64, resources, [], "net", 200_008)
    env = dict(entry.split("=", 1) for entry in template["ContainerSpec"]["Env"])
    assert env[ENV_GRPC] == "1"
    assert AgentConfig.from_env(env).serve_grpc


def test_an_agent_not_asked_serves_frames_only() -> None:
    env = agent_env() | confinement.agent_env(200_008)
    assert ENV_GRPC not in env
    assert not AgentConfig.from_env(env).serve_grpc
    assert not AgentConfig.from_env(env | {ENV_GRPC: "0"}).serve_grpc
    assert AgentConfig().serve_grpc  # an agent embedded in the plane's process (the local provider) serves both
