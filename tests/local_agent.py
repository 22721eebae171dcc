"""A real sandbox agent served in the test's own process on a Unix socket (no container), and a client of it:
what the agent-protocol tests (frames, tool streams, networking) talk to."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

from controlplane.sandbox.agent_client import GrpcSandboxAgent
from sandbox_agent.config import AgentConfig
from sandbox_agent.serving import serve
from tests.planes import short_tmp


@contextlib.asynccontextmanager
async def local_agent(socket_name: str = "agent.sock") -> AsyncIterator[tuple[GrpcSandboxAgent, asyncio.Event, Path]]:
    """(client, the event that stops the agent, the root dir): the workspace is `root / "ws"`, the socket
    `root / socket_name`; everything is removed at the end."""
    root = short_tmp()
    (root / "ws").mkdir()
    config = AgentConfig(socket_path=str(root / socket_name), workspace=str(root / "ws"), tool_uid=-1,
                         tool_home=str(root / "home"))
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.ensure_future(serve(config, ready, stop))
    await ready.wait()
    client = GrpcSandboxAgent(f"unix:{config.socket_path}", "sbx")
    try:
        yield client, stop, root
    finally:
        await client.close()
        stop.set()
        await server
        shutil.rmtree(root, ignore_errors=True)
