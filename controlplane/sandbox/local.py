"""The real sandbox agent served from this process, one per sandbox: no isolation at all.

For fast tests of everything above the provider (the rpc layer, sessions, the client). The Docker
provider is the product; this one never hardens anything and must not host untrusted code.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

from controlplane.core.seam.provider import (
    PoolStats,
    ReconcileReport,
    Sandbox,
    SandboxLedger,
    SandboxProvider,
    SandboxRecord,
)
from controlplane.core.sessions.models import Resources
from controlplane.errors import SandboxLostError, SandboxStartError
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.layout import LABEL_INSTANCE, LABEL_SESSION, SandboxDirs
from sandbox_agent.config import AgentConfig
from sandbox_agent.serving import serve


class LocalSandboxProvider(SandboxProvider):
    def __init__(self, data_dir: Path, instance: str, ledger: SandboxLedger) -> None:
        self._dirs = SandboxDirs(data_dir)
        self._instance = instance
        self._ledger = ledger
        self._running: dict[str, tuple[Sandbox, asyncio.Event, asyncio.Task[None]]] = {}
        self._attached: dict[str, Sandbox] = {}
        """Other control planes' sandboxes this one has reached (see `attach`)."""

    async def start(self, live: Mapping[str, str]) -> ReconcileReport:
        report = ReconcileReport()
        for record in await self._ledger.list_sandboxes(self._instance):
            # In-process agents die with the process: nothing can be adopted.
            if record.id in live:
                report.lost.append(record.id)
            await self.destroy(record.id)
        return report

    async def acquire(self, session_id: str, tenant: str, resources: Resources, template: str = "default") -> Sandbox:
        sandbox_id = secrets.token_hex(6)
        path = self._dirs.create(sandbox_id, {LABEL_INSTANCE: self._instance, LABEL_SESSION: session_id})
        workspace = path / "workspace"
        workspace.mkdir()
        config = AgentConfig(
            socket_path=str(self._dirs.socket_path(sandbox_id)), workspace=str(workspace), tool_uid=-1,
            tool_home=str(path / "home"),
        )
        ready, stop = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        task = loop.create_task(serve(config, ready, stop))
        up = loop.create_task(ready.wait())
        try:
            await asyncio.wait({task, up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
        if not ready.is_set():
            self._dirs.remove(sandbox_id)
            raise SandboxStartError(f"the in-process agent did not start: {task.exception()!r}")
        sandbox = Sandbox(sandbox_id, GrpcSandboxAgent(f"unix:{config.socket_path}", sandbox_id))
        self._running[sandbox_id] = (sandbox, stop, task)
        try:  # as every provider: an agent that does not speak this plane's protocol is not used (agent_protocol)
            await sandbox.agent.health()
        except BaseException:
            await self._stop(sandbox_id)
            raise
        await self._ledger.put_sandbox(SandboxRecord(sandbox_id, self._instance, "claimed", session_id, time.time()))
        return sandbox

    async def get(self, sandbox_id: str) -> Sandbox:
        if sandbox_id not in self._running:
            raise SandboxLostError(f"sandbox {sandbox_id} does not exist (any more)")
        return self._running[sandbox_id][0]

    async def attach(self, sandbox_id: str) -> Sandbox:
        """Reaches another control plane's in-process agent through its socket: both planes must share the
        data dir (and run on one host)."""
        if sandbox_id in self._running:
            return self._running[sandbox_id][0]
        known = self._attached.get(sandbox_id)
        if known is not None:
            return known
        socket = self._dirs.socket_path(sandbox_id)
        if not socket.exists():
            raise SandboxLostError(f"sandbox {sandbox_id} has no agent socket under this data dir")
        sandbox = Sandbox(sandbox_id, GrpcSandboxAgent(f"unix:{socket}", sandbox_id))
        self._attached[sandbox_id] = sandbox
        return sandbox

    async def destroy(self, sandbox_id: str) -> None:
        await self._stop(sandbox_id)
        await self._ledger.forget_sandbox(sandbox_id)

    async def _stop(self, sandbox_id: str) -> None:
        entry = self._running.pop(sandbox_id, None)
        if entry is not None:
            sandbox, stop, task = entry
            await sandbox.agent.close()
            stop.set()
            with contextlib.suppress(Exception):
                await task
        self._dirs.remove(sandbox_id)

    async def close(self) -> None:
        # The records stay: the next start reports these sessions' sandboxes as lost (they die with us).
        for sandbox_id in list(self._running):
            await self._stop(sandbox_id)
        for sandbox in self._attached.values():
            await sandbox.agent.close()
        self._attached.clear()

    network_port = 0
    """The agent is a host process here: its forwarder takes any free port of the host's loopback."""

    def network_socket(self, sandbox_id: str) -> str:
        return str(self._dirs.egress_socket_path(sandbox_id))

    def pool_stats(self) -> PoolStats:
        return PoolStats(0, 0, 0, 0, 0)
