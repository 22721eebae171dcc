"""Hosts the SandboxAgent service: on the framed socket always, and on gRPC only where the agent must.

gRPC is served when the control plane reaches the agent through something that carries gRPC (the Swarm relay:
AGENT_GRPC=1), or when the framed socket cannot be made (its path over the Unix socket limit): only then is grpc
imported. A Docker-provider agent serves frames alone and never loads grpc, which is most of an idle sandbox's
memory and, through grpc's EventEngine timers, most of its idle CPU (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from sandbox_agent import server_identity
from sandbox_agent.config import AgentConfig
from sandbox_agent.frames import FramesServer, frames_path
from sandbox_agent.gc_tuning import tune_after_startup
from sandbox_agent.rpc_methods import METHODS
from sandbox_agent.server import SandboxAgentService, prepare_home


async def serve(config: AgentConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    """Serves until `stop` is set or, when the caller gives none (the agent owns its process), until
    SIGTERM/SIGINT; the sockets are private to their owner."""
    os.makedirs(os.path.dirname(config.socket_path), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(config.socket_path)
    service = SandboxAgentService(config)
    await prepare_home(service, config)
    frames = FramesServer(frames_path(config.socket_path), METHODS, service)
    # Before the gRPC socket answers: a plane that finds the framed socket uses it for every call, and one that
    # finds only the gRPC socket keeps this agent on gRPC for good.
    framed = await frames.start()
    # Once the socket serves (not before: a cold CreateSession waits for that): the one process the first tool
    # host's start would otherwise wait for, started while the plane finishes the creation. The spawner helper is
    # not started here: a pooled sandbox holds none until it is claimed (SandboxAgentService.SnapshotCustomCode).
    probing = server_identity.probe_split_uid_early(config.tool_uid, config.output_buffer_bytes)
    server: Any = None
    if config.serve_grpc or not framed:
        from sandbox_agent import grpc_serving  # only here: a frames-only agent never loads grpc

        server = grpc_serving.server(service, config.socket_path)
        try:
            await server.start()
        except BaseException:
            await frames.stop(grace_s=0)
            raise
        os.chmod(config.socket_path, 0o600)
    if stop is None:
        # An embedding process (the control plane's in-process agents) keeps its own signal handling.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        tune_after_startup()
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        if probing is not None:
            probing.cancel()
        await service.stop_all()
        await asyncio.gather(frames.stop(grace_s=0.5), *([server.stop(grace=0.5)] if server is not None else []))
        service.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(config.socket_path)
