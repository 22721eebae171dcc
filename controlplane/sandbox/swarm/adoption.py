"""The Swarm provider's start: which of this instance's services it adopts (claimed ones of live sessions, pooled
ones of their template's current image) and which it removes with their networks, and which socket dirs the relays
keep. Functions of the provider (provider.py is at the module size bound)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controlplane.core.seam.provider import ReconcileReport, SandboxRecord
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE
from controlplane.errors import SandboxError
from controlplane.sandbox.layout import LABEL_IMAGE, LABEL_INSTANCE, LABEL_ROLE, LABEL_SANDBOX, LABEL_TEMPLATE

if TYPE_CHECKING:
    from controlplane.sandbox.swarm.provider import SwarmSandboxProvider


async def reconcile(provider: SwarmSandboxProvider, live: Mapping[str, str]) -> ReconcileReport:
    report = ReconcileReport()
    records = {r.id: r for r in await provider._ledger.list_sandboxes(provider._instance)}
    filters = {"label": [f"{LABEL_INSTANCE}={provider._instance}", f"{LABEL_ROLE}=sandbox"]}
    services = await asyncio.to_thread(provider._api.services, filters=filters)
    kept: set[str] = set()
    for service in services:
        sandbox_id = service["Spec"]["Labels"].get(LABEL_SANDBOX, "")
        record = records.get(sandbox_id)
        if record is not None and await _adopt(provider, service, record, live, report):
            kept.add(sandbox_id)
        else:
            await provider.destroy(sandbox_id)
            report.removed.append(sandbox_id)
    for sandbox_id, record in records.items():
        if sandbox_id not in kept:
            if record.state == "claimed" and sandbox_id in live:
                report.lost.append(sandbox_id)
            await provider.destroy(sandbox_id)
    networks = await asyncio.to_thread(provider._api.networks, filters=filters)
    for network in networks:
        if (network.get("Labels") or {}).get(LABEL_SANDBOX) not in kept:
            await asyncio.to_thread(provider._remove_service_and_network, network["Labels"].get(LABEL_SANDBOX, ""))
            report.removed.append(network.get("Name", ""))
    retain = {"op": "retain", "instance": provider._instance, "keep": sorted(kept)}
    relays = provider._fleet.relays.values()
    await asyncio.gather(*(r.client.request(retain) for r in relays), return_exceptions=True)
    return report


async def _adopt(
    provider: SwarmSandboxProvider, service: dict[str, Any], record: SandboxRecord, live: Mapping[str, str],
    report: ReconcileReport,
) -> bool:
    if record.state == "creating" or (record.state == "claimed" and live.get(record.id) != record.session_id):
        return False
    labels = service["Spec"]["Labels"]
    template = labels.get(LABEL_TEMPLATE, DEFAULT_TEMPLATE)
    if record.state == "pool" and labels.get(LABEL_IMAGE) != provider._templates.ready_image(template):
        return False  # not its template's image now (a new sandbox image, a rebuilt or undeclared template)
    node = await asyncio.to_thread(provider._running_node, str(service["ID"]))
    if node is None:
        return False
    try:
        remote = await provider._connect(record.id, node, service["ID"])
        await remote.sandbox.agent.health(timeout_s=10.0)
    except SandboxError:
        remote_ = provider._live.pop(record.id, None)
        if remote_ is not None:
            await remote_.close()
        return False
    if record.state == "pool":
        provider._pools.pool_for("", template).adopt(remote.sandbox)
        report.pooled.append(record.id)
    else:
        report.adopted.append(record.id)
    return True
