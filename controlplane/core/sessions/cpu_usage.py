"""CPU-seconds per tenant: what its sandboxes have used, kept after they are removed (GetUsage, metrics).

A sandbox's CPU time is the provider's reading of it (its container's cgroup), which goes with the sandbox:
so the last reading is written to the store just before the sandbox is removed, keyed by sandbox, and a
tenant's figure is the stored readings of its removed sandboxes plus the live readings of those still held.
Keyed by sandbox, a removal that is tried again (it failed halfway) does not count twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from controlplane.core.seam.provider import SandboxProvider

log = logging.getLogger(__name__)


class CpuStore(Protocol):
    async def put_sandbox_cpu(self, sandbox_id: str, tenant: str, cpu_seconds: float) -> None: ...

    async def tenant_cpu_seconds(self, tenant: str) -> float: ...


class CpuAccount:
    def __init__(self, provider: SandboxProvider, store: CpuStore | None) -> None:
        self._provider = provider
        self._store = store

    async def settle(self, tenant: str, sandbox_id: str) -> None:
        """Keeps the sandbox's CPU time before it is removed (nothing where the provider does not measure it)."""
        if self._store is None or not sandbox_id:
            return
        try:
            used = await self._provider.cpu_seconds(sandbox_id)
            if used is not None:
                await self._store.put_sandbox_cpu(sandbox_id, tenant, used)
        except Exception as exc:  # accounting must not keep a sandbox from being removed
            log.warning("could not keep the CPU time of sandbox %s (tenant %s): %s", sandbox_id, tenant, exc)

    async def total(self, tenant: str, live_sandboxes: Iterable[str]) -> float:
        """The tenant's removed sandboxes' CPU time plus what its live ones (those this plane holds) used so far."""
        ended = await self._store.tenant_cpu_seconds(tenant) if self._store is not None else 0.0
        live = 0.0
        for sandbox_id in live_sandboxes:
            used = await self._provider.cpu_seconds(sandbox_id)
            live += used or 0.0
        return round(ended + live, 3)
