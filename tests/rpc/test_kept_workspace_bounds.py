"""How a tenant's kept workspaces (taken snapshots, paused sessions' stored workspaces, retained ones) are counted
and bounded, through the public API on the local plane: concurrent pauses cannot all pass the count, every stored
byte counts toward the tenant's disk quota (and shows in GetUsage), and a paused session ends as expired after
lifetime.max_paused_s, timed from what the storage holds, so a restart does not reset it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import (
    Plane,
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    served_plane,
    short_tmp,
    tenant_clients,
)

MIB = 1024 * 1024
SESSION_MB = 64
# gamma: one live session's workspace disk and 4 MiB more, which two stored 2 MiB workspaces fill.
TENANTS: list[dict[str, Any]] = [{"name": "alpha", "token": "kept-alpha"},
                               {"name": "gamma", "token": "kept-gamma", "quota": {"disk_mb": SESSION_MB + 4}}]
plane = served_plane("local", tenants=TENANTS, pool={"size": 0}, snapshots={"max_per_tenant": 2},
                     resources={"disk_mb": SESSION_MB}, lifetime={"retain_s": 3600})
clients = tenant_clients(TENANTS)


@pytest_asyncio.fixture
async def admin(plane: Plane) -> AsyncIterator[AsyncAdminClient]:
    token = plane.plane.settings.admin_token_file.read_text().strip()
    async with AsyncAdminClient(plane.plane.address, token) as client:
        yield client


async def _refused(coro: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coro
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    return caught.value.details() or ""


async def _outcome(coro: Any) -> grpc.StatusCode:
    try:
        await coro
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_concurrent_pauses_cannot_all_pass_the_paused_count(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    files = {f"f{i}.bin": os.urandom(256 * 1024) for i in range(8)}  # a copy long enough for the pauses to overlap
    sessions = [await alpha.create_session(workspace_archive=tar_of(files)) for _ in range(5)]
    codes = await asyncio.gather(*(_outcome(alpha.pause(s.id)) for s in sessions))
    assert sorted(c.name for c in codes) == ["OK", "OK", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED",
                                             "RESOURCE_EXHAUSTED"]
    states = [(await alpha.get_session(s.id)).state for s in sessions]
    assert states.count(session_pb2.Session.PAUSED) == 2
    assert states.count(session_pb2.Session.READY) == 3  # a refused pause leaves its session running


async def test_a_snapshot_and_pauses_of_one_tenant_take_turns(clients: dict[str, AsyncClient]) -> None:
    # Snapshots and pauses share the tenant's turn: each count sees what the other stored.
    alpha = clients["alpha"]
    sessions = [await alpha.create_session(workspace_archive=tar_of({"a.bin": os.urandom(MIB)})) for _ in range(4)]
    taken = [alpha.snapshot(sessions[0].id) for _ in range(3)]
    paused = [alpha.pause(s.id) for s in sessions[1:]]
    codes = await asyncio.gather(*(_outcome(c) for c in [*taken, *paused]))
    assert [c.name for c in codes[:3]].count("OK") == 2  # max_per_tenant taken snapshots
    assert [c.name for c in codes[3:]].count("OK") == 2  # and as many paused sessions
    for snap in await alpha.list_snapshots():
        await alpha.delete_snapshot(snap.id)


async def test_retained_and_paused_workspaces_count_toward_the_disk_quota(
    clients: dict[str, AsyncClient], admin: AsyncAdminClient
) -> None:
    gamma = clients["gamma"]
    ended = await gamma.create_session(workspace_archive=tar_of({"noise.bin": os.urandom(2 * MIB)}))
    retained = await gamma.delete_keeping(ended.id)
    paused = await gamma.create_session(workspace_archive=tar_of({"noise.bin": os.urandom(2 * MIB)}))
    await gamma.pause(paused.id)  # its live workspace's 64 MiB give way to its stored 2 MiB
    usage = await admin.usage("gamma")
    assert usage.sessions == 0
    assert usage.disk_mb == 5  # two incompressible 2 MiB workspaces and their gzip framing, rounded up
    details = await _refused(gamma.create_session())
    assert "tenant gamma's quota of 68 MiB of workspace disk would be exceeded (quota.disk_mb): 0 reserved by " \
           "live sessions, 4.0 held by stored workspaces" in details
    await gamma.delete_snapshot(retained.id)  # the retained one gone, a session fits again
    assert (await admin.usage("gamma")).disk_mb == 3
    session = await gamma.create_session()
    assert (await admin.usage("gamma")).disk_mb == SESSION_MB + 3
    await gamma.delete_session(session.id)
    await gamma.delete_session(paused.id)
    assert (await admin.usage("gamma")).disk_mb == 0


expiring = served_plane("local", name="expiring_plane", scope="function", pool={"size": 0},
                        lifetime={"reap_interval_s": 0.25, "max_paused_s": 2, "retain_s": 3600})
dropping = served_plane("local", name="dropping_plane", scope="function", pool={"size": 0},
                        lifetime={"reap_interval_s": 0.25, "max_paused_s": 2})


async def _deleted(client: AsyncClient, session_id: str, within_s: float) -> session_pb2.Session:
    deadline = time.monotonic() + within_s
    while (session := await client.get_session(session_id)).state != session_pb2.Session.DELETED:
        assert time.monotonic() < deadline, f"session {session_id} is still {session.state}"
        await asyncio.sleep(0.2)
    return session


async def test_a_session_paused_past_max_paused_s_ends_and_its_workspace_is_retained(expiring_plane: Plane) -> None:
    client = expiring_plane.client
    session = await client.create_session(workspace_archive=tar_of({"work.txt": "paused work\n"}))
    await client.pause(session.id)
    ended = await _deleted(client, session.id, 15)
    assert ended.status_message == "expired: paused for 2 s"
    [kept] = [s for s in await client.list_snapshots() if s.session_id == session.id]
    assert kept.retained
    restored = await client.create_session(from_snapshot=kept.id)
    assert await client.read_file(restored.id, "work.txt") == b"paused work\n"
    await client.delete_session(restored.id)


async def test_without_retention_an_expired_paused_session_takes_its_workspace_along(dropping_plane: Plane) -> None:
    client = dropping_plane.client
    session = await client.create_session(workspace_archive=tar_of({"work.txt": "gone\n"}))
    await client.pause(session.id)
    storage = dropping_plane.plane.settings.snapshots.root(dropping_plane.plane.settings.data_dir)
    assert list(storage.rglob("snap_*.json"))  # its stored workspace, while paused
    ended = await _deleted(client, session.id, 15)
    assert ended.status_message == "expired: paused for 2 s"
    assert not list(storage.rglob("snap_*.json"))
    assert await client.list_snapshots() == []


LIMIT_S = 20
"""Long enough that a plane starting on a loaded machine (several seconds) is still well inside it."""


async def test_max_paused_s_counts_from_the_pause_across_a_restart() -> None:
    data_dir, instance = short_tmp(), new_instance("mp")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    process.env |= {"CONTROLPLANE_PROVIDER__TYPE": "local", "CONTROLPLANE_LIFETIME__REAP_INTERVAL_S": "0.25"}
    try:
        client = AsyncClient(await process.start(), process.token())
        session = await client.create_session(workspace_archive=tar_of({"work.txt": "mine\n"}))
        await client.pause(session.id)
        await client.close()
        process.kill()
        await asyncio.sleep(LIMIT_S)
        # Restarted with a limit the pause has already outlived: it ends at the first scan. Had the time counted from
        # anything the plane holds in memory, it could not end before LIMIT_S after this restart began.
        process.env["CONTROLPLANE_LIFETIME__MAX_PAUSED_S"] = str(LIMIT_S)
        restarting = time.monotonic()
        client = AsyncClient(await process.start(), process.token())
        ended = await _deleted(client, session.id, LIMIT_S - 0.5 - (time.monotonic() - restarting))
        assert ended.status_message == f"expired: paused for {LIMIT_S} s"
        await client.close()
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
