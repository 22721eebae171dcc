"""What bounds a tenant's snapshots, through the public API on the local plane: how many it may keep, and its
disk quota, which counts a snapshot's stored bytes beside its live sessions' workspaces."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from tests.planes import Plane, served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [{"name": "alpha", "token": "snaplim-alpha"},
                               {"name": "beta", "token": "snaplim-beta", "quota": {"disk_mb": 1026}}]
plane = served_plane("local", tenants=TENANTS, pool={"size": 0}, snapshots={"max_per_tenant": 2},
                     resources={"disk_mb": 1024})
clients = tenant_clients(TENANTS)


async def _refused(coro: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coro
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return caught.value.details() or ""


async def test_a_tenant_keeps_at_most_max_per_tenant(plane: Plane, clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    first = await alpha.snapshot(session.id)
    await alpha.snapshot(session.id)
    assert "keeps 2 snapshots, the most allowed (snapshots.max_per_tenant = 2)" in await _refused(
        alpha.snapshot(session.id))
    assert len(await alpha.list_snapshots()) == 2
    await alpha.delete_snapshot(first.id)
    await alpha.snapshot(session.id)
    for snap in await alpha.list_snapshots():
        await alpha.delete_snapshot(snap.id)


async def test_snapshot_bytes_count_toward_the_disk_quota(plane: Plane, clients: dict[str, AsyncClient]) -> None:
    beta = clients["beta"]
    session = await beta.create_session()  # reserves 1024 of the 1026 MiB
    small = await beta.snapshot(session.id)
    await beta.write_file(session.id, "noise.bin", os.urandom(3 << 20))
    details = await _refused(beta.snapshot(session.id))
    assert "tenant beta's disk quota of 1026 MiB would be exceeded: 1024 MiB reserved by live sessions" in details
    assert [s.id for s in await beta.list_snapshots()] == [small.id]  # the refused one is not kept
    await beta.delete_snapshot(small.id)
