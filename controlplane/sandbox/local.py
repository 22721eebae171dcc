"""The real sandbox agent served from this process, one per sandbox: no isolation at all.

For fast tests of everything above the provider (the rpc layer, sessions, the client). The Docker
provider is the product; this one never hardens anything and must not host untrusted code.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.core.models import Resources
from controlplane.errors import SandboxLostError, SandboxStartError
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.layout import SandboxDirs
from controlplane.sandbox.provider import (
    PoolStats,
    ReconcileReport,
    Sandbox,
    SandboxLedger,
    SandboxProvider,
    SandboxRecord,
)
from sandbox_agent.config import AgentConfig
from sandbox_agent.server import serve


class LocalSandboxProvider(SandboxProvider):
    def __init__(self, data_dir: Path, instance: str, ledger: SandboxLedger) -> None:
        self._dirs = SandboxDirs(data_dir)
        self._instance = instance
        self._ledger = ledger
        self._running: dict[str, tuple[Sandbox, asyncio.Event, asyncio.Task[None]]] = {}
        self._starting = asyncio.Lock()
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

    async def acquire(self, session_id: str, tenant: str, resources: Resources) -> Sandbox:
        sandbox_id = secrets.token_hex(6)
        path = self._dirs.create(sandbox_id, {"ocsb.instance": self._instance, "ocsb.session": session_id})
        workspace = path / "workspace"
        workspace.mkdir()
        config = AgentConfig(
            socket_path=str(self._dirs.socket_path(sandbox_id)), workspace=str(workspace), tool_uid=-1,
            tool_home=str(path / "home"),
        )
        ready, stop = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        async with self._starting:  # one agent at a time takes and gives back the process's signals
            saved = _SignalHandlers.save(loop)
            task = loop.create_task(serve(config, ready, stop))
            up = loop.create_task(ready.wait())
            try:
                await asyncio.wait({task, up}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                up.cancel()
                saved.restore()
        if not ready.is_set():
            self._dirs.remove(sandbox_id)
            raise SandboxStartError(f"the in-process agent did not start: {task.exception()!r}")
        sandbox = Sandbox(sandbox_id, GrpcSandboxAgent(f"unix:{config.socket_path}", sandbox_id))
        self._running[sandbox_id] = (sandbox, stop, task)
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

    def pool_stats(self) -> PoolStats:
        return PoolStats(0, 0, 0, 0, 0)


@dataclass
class _SignalHandlers:
    """The event loop's SIGTERM/SIGINT handlers. An in-process agent's `serve` installs its own, which
    would make the process's SIGTERM stop that one agent instead of the control plane: they are put back
    once the agent is up. asyncio has no public getter for them, hence its private table."""

    loop: asyncio.AbstractEventLoop
    handles: dict[int, Any]
    plain: dict[int, Any]

    @classmethod
    def save(cls, loop: asyncio.AbstractEventLoop) -> _SignalHandlers:
        table: dict[int, Any] = getattr(loop, "_signal_handlers", {})
        return cls(loop, {sig: table.get(sig) for sig in _SIGNALS}, {sig: signal.getsignal(sig) for sig in _SIGNALS})

    def restore(self) -> None:
        for sig, handle in self.handles.items():
            if handle is not None:
                self.loop.add_signal_handler(sig, handle._callback, *handle._args)
            elif self.loop.remove_signal_handler(sig):
                signal.signal(sig, self.plain[sig])  # e.g. Python's KeyboardInterrupt for SIGINT


_SIGNALS = (signal.SIGTERM, signal.SIGINT)
