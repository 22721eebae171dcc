"""The agent's settings, read once from its environment (set by the control plane's provider)."""

from __future__ import annotations

import os
from dataclasses import dataclass

GRPC_VAR = "AGENT_GRPC"


@dataclass(frozen=True)
class AgentConfig:
    socket_path: str = "/run/agent/agent.sock"
    """Unix socket the agent serves on; its directory is the per-sandbox host mount."""
    workspace: str = "/workspace"
    """The only writable directory besides the tmpfs mounts."""
    tool_uid: int = 1000
    """uid (and gid) of every tool process; the control plane gives each sandbox its own (AGENT_TOOL_UID), and
    the uids after it are its servers' (server_identity.server_uid)."""
    tool_home: str = "/tmp/home"
    """HOME for tool processes; on the /tmp tmpfs, so Bun and git can write there."""
    kill_grace_ms: int = 200
    """Default delay between SIGTERM and SIGKILL when a command is stopped."""
    output_buffer_bytes: int = 4 * 1024 * 1024
    """Output held per command before reading pauses (backpressure on a slow client)."""
    max_upload_bytes: int = 1024 * 1024 * 1024
    """Largest workspace upload, in extracted bytes."""
    output_budget_bytes: int = 0
    """What all saved tool outputs may take together; 0: a quarter of their filesystem (the /tmp tmpfs)."""
    code_dir: str = ""
    """Where the session's code snapshot goes: the providers' root-owned tmpfs (no ancestor a tool process can
    write, which the agent checks); "" on the local plane (a host process without isolation): a tmp dir."""
    syscall_deny: str = ""
    """System calls the agent's own seccomp filter denies (comma-separated, see syscall_filter); "": none."""
    serve_grpc: bool = True
    """Serve gRPC beside the framed socket (serving.py). A container's agent does only where its provider asks
    (AGENT_GRPC=1: the Swarm relay carries gRPC); an agent embedded in the control plane's process (the local
    provider) serves both, grpc being loaded there anyway."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AgentConfig:
        env = dict(os.environ) if env is None else env
        default = cls()
        return cls(
            socket_path=env.get("AGENT_SOCKET", default.socket_path),
            workspace=env.get("AGENT_WORKSPACE", default.workspace),
            tool_uid=int(env.get("AGENT_TOOL_UID", default.tool_uid)),
            tool_home=env.get("AGENT_TOOL_HOME", default.tool_home),
            kill_grace_ms=int(env.get("AGENT_KILL_GRACE_MS", default.kill_grace_ms)),
            output_buffer_bytes=int(env.get("AGENT_OUTPUT_BUFFER_BYTES", default.output_buffer_bytes)),
            max_upload_bytes=int(env.get("AGENT_MAX_UPLOAD_BYTES", default.max_upload_bytes)),
            output_budget_bytes=int(env.get("AGENT_OUTPUT_BUDGET_BYTES", default.output_budget_bytes)),
            code_dir=env.get("AGENT_CODE_DIR", default.code_dir),
            syscall_deny=env.get("AGENT_SYSCALL_DENY", default.syscall_deny),
            serve_grpc=env.get(GRPC_VAR, "0") == "1",
        )
