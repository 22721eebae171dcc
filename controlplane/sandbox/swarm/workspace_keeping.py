"""The Swarm provider's side of `provider.workspace_disk` (node_disks): disks prepared before a service and
released on the nodes its task did not land on, a failed sandbox retired with its workspace kept on its node,
salvage read through that node's engine, and leftovers of crashes removed at start. A mixin of the provider
(provider.py is at the module size bound); without `workspace_disk` every call is the tmpfs behaviour. "auto"
(the default) is resolved at start by disk_auto."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

from controlplane.config import SwarmProviderConfig
from controlplane.core.calls.tracked_tasks import TrackedTasks
from controlplane.core.seam.provider import SandboxLedger, SandboxProvider
from controlplane.sandbox import workspace_salvage
from controlplane.sandbox.swarm import disk_auto
from controlplane.sandbox.swarm.fleet import RelayFleet
from controlplane.sandbox.swarm.node_disks import NodeDisks, service_mount

log = logging.getLogger("controlplane.sandbox.swarm")


class SwarmWorkspaces(SandboxProvider):
    _disks: NodeDisks | None
    _disk_new: bool
    """Whether new sandboxes get a disk; `_disks` may outlive that (auto turned off) for earlier sandboxes' disks."""
    _disk_auto: bool
    _config: SwarmProviderConfig
    _api: Any
    _retained: set[str]
    _instance: str
    _live: dict[str, Any]
    _fleet: RelayFleet
    _ledger: SandboxLedger
    _remove_service_and_network: Callable[[str], None]
    _cleanups: TrackedTasks
    _state_dir: Path

    def _init_disks(self, config: SwarmProviderConfig, client: Any, instance: str) -> None:
        self._retained = set()
        self._disk_auto = config.workspace_disk == "auto"
        self._disk_new = bool(config.workspace_disk)
        self._disks = NodeDisks(client, config.node_engines, instance, config.image, config.disk_root,
                                config.workspace_mb) if config.workspace_disk else None

    @property
    def workspace_disk(self) -> bool:
        """Whether new sandboxes' workspaces are kept disks (`workspace_disk` as resolved at start)."""
        return self._disks is not None and self._disk_new

    async def _start_disks(self) -> None:
        """Before any sandbox is made or adopted: disks and volumes of sandboxes this instance has no record of
        (a crash between making and recording, or between removing and forgetting) and no retained (failed, not
        yet deleted) session owns are removed; those of records adoption drops go with their `destroy`."""
        if self._disks is None:
            return
        await asyncio.to_thread(self._disks.start)
        records = await self._ledger.list_sandboxes(self._instance)
        removed = await asyncio.to_thread(self._disks.reconcile, {*(r.id for r in records), *self._retained})
        if removed:
            log.info("workspace disks of no sandbox removed: %s", ", ".join(removed))
        if self._disk_auto:
            await self._resolve_auto(self._disks)

    async def _resolve_auto(self, disks: NodeDisks) -> None:
        """`workspace_disk = "auto"`: on when every node that may run sessions is held and the helper works there
        (disk_auto). Off, the disks of sandboxes made while it was on stay managed until those sandboxes go."""
        nodes = disk_auto.session_nodes(await asyncio.to_thread(self._api.nodes), self._config.constraints)
        probe = f"probe{secrets.token_hex(4)}"
        held = [node for node in nodes if node in disks.engines]
        errors = await asyncio.gather(*(asyncio.to_thread(disks.probe, node, probe) for node in held))
        choice = disk_auto.choose(nodes, disks.engines, {n: e for n, e in zip(held, errors, strict=True) if e})
        (log.info if choice.on else log.warning)("%s", choice.log_line())
        self._disk_new = choice.on
        if not choice.on and not await asyncio.to_thread(disks.any_volume):
            await asyncio.to_thread(disks.close)
            self._disks = None

    async def _close_disks(self) -> None:
        if self._disks is not None:
            await asyncio.to_thread(self._disks.close)

    def _workspace_mount(self, sandbox_id: str) -> Any:
        return service_mount(self._instance, sandbox_id) if self.workspace_disk else None

    async def _prepare_disks(self, sandbox_id: str, nodes: Iterable[str], labels: dict[str, str]) -> list[str]:
        """Makes the disk on each candidate node (in parallel); returns the nodes to exclude from placement."""
        disks = self._disks
        if disks is None or not self._disk_new:
            return []
        done = await asyncio.gather(*(asyncio.to_thread(disks.prepare, sandbox_id, [n], labels) for n in nodes))
        return [node for failed in done for node in failed]

    async def _release_disks(self, sandbox_id: str, except_node: str = "") -> None:
        """In the background (awaited at close): a volume can go only once its task's container has stopped (its
        grace period), which a delete, a pause or a create need not wait for; a crash meanwhile leaves what the
        next start removes."""
        if self._disks is not None:
            self._cleanups.start(asyncio.to_thread(self._disks.release, sandbox_id, except_node))
        if not except_node:
            self._retained.discard(sandbox_id)

    async def keeps_workspace(self, sandbox_id: str) -> bool:
        """Where the sandbox has a disk: what `retire` keeps and `salvage` reads (else the tmpfs, which goes)."""
        disks = self._disks
        return disks is not None and (self._disk_new or await asyncio.to_thread(disks.holder, sandbox_id) is not None)

    async def retire(self, sandbox_id: str) -> None:
        """The service, network and socket dirs go; the workspace volume stays on its node until `destroy`."""
        if not await self.keeps_workspace(sandbox_id):
            await super().retire(sandbox_id)
            return
        self._retained.add(sandbox_id)
        remote = self._live.pop(sandbox_id, None)
        if remote is not None:
            await remote.close()
        await asyncio.to_thread(self._remove_service_and_network, sandbox_id)
        request = {"op": "remove", "instance": self._instance, "sandbox": sandbox_id}
        await asyncio.gather(*(r.client.request(request) for r in self._fleet.relays.values()),
                             return_exceptions=True)
        await self._ledger.forget_sandbox(sandbox_id)

    def salvage(self, sandbox_id: str) -> AsyncIterator[bytes]:
        if self._disks is None or not (self._disk_new or sandbox_id in self._retained):
            return super().salvage(sandbox_id)
        return self._salvage_disk(self._disks, sandbox_id)

    async def _salvage_disk(self, disks: NodeDisks, sandbox_id: str) -> AsyncIterator[bytes]:
        client, volume, labels = await asyncio.to_thread(disks.volume_of, sandbox_id)
        # Spooled under the data dir (the state dir's parent), as the Docker provider's salvage is.
        async for chunk in workspace_salvage.read(client, self._state_dir, volume, labels, self._cleanups):
            yield chunk

    def retain(self, sandbox_ids: Iterable[str]) -> None:
        self._retained.update(sandbox_ids)
