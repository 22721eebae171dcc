"""Nothing lost at the end, through the public API on Docker sandboxes: an expired session, a FAILED one (its
container killed) and one deleted with keep_snapshot each leave a retained snapshot that lists and restores, and
the reaper purges it after lifetime.retain_s."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import Plane, instance_containers, served_plane

pytestmark = pytest.mark.docker

IDLE_S = 8
plane = served_plane("docker", pool={"size": 0},
                     lifetime={"idle_timeout_s": IDLE_S, "reap_interval_s": 0.5, "retain_s": 3600})
TODOS = [{"content": "Survive the end", "status": "pending", "priority": "low"}]


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def _retained_of(client: AsyncClient, session_id: str) -> session_pb2.Snapshot:
    kept = [s for s in await client.list_snapshots() if s.session_id == session_id]
    assert len(kept) == 1, kept
    assert kept[0].retained
    return kept[0]


async def _state_becomes(client: AsyncClient, session_id: str, state: Any, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while (await client.get_session(session_id)).state != state:
        assert time.monotonic() < deadline, f"session {session_id} did not become {state}"
        await asyncio.sleep(0.25)


async def _restores(client: AsyncClient, snapshot_id: str, expected: str) -> None:
    restored = await client.create_session(from_snapshot=snapshot_id)
    try:
        assert await _sh(client, restored.id, "cat /workspace/work.txt") == expected
        assert await client.read_file(restored.id, "work.txt") == expected.encode()  # through the files API
        assert json.loads((await client.execute_tool(restored.id, "todoread", {})).output) == TODOS
    finally:
        await client.delete_session(restored.id)


async def _working_session(client: AsyncClient, text: str) -> session_pb2.Session:
    session = await client.create_session(workspace_archive=tar_of({"seed.txt": "seed\n"}))
    await _sh(client, session.id, f"echo {text} > /workspace/work.txt")
    await client.execute_tool(session.id, "todowrite", {"todos": TODOS})
    return session


async def test_an_expired_session_keeps_its_workspace_as_a_retained_snapshot(plane: Plane) -> None:
    client = plane.client
    session = await _working_session(client, "expired-work")
    await _state_becomes(client, session.id, session_pb2.Session.DELETED, IDLE_S + 20)
    assert (await client.get_session(session.id)).status_message.startswith("expired: idle")
    kept = await _retained_of(client, session.id)
    assert 3500 < kept.purge_at.seconds - time.time() <= 3600
    await _restores(client, kept.id, "expired-work\n")
    await client.delete_snapshot(kept.id)


async def test_a_failed_session_keeps_its_workspace_though_its_container_was_killed(plane: Plane) -> None:
    client = plane.client
    session = await _working_session(client, "failed-work")
    [container] = [c for c in instance_containers(plane.instance) if c.labels.get("ocsb.sandbox") == session.sandbox_id]
    await asyncio.to_thread(container.kill)
    with pytest.raises(grpc.aio.AioRpcError):
        await client.run(session.id, command="true")
    await _state_becomes(client, session.id, session_pb2.Session.FAILED, 10)
    kept = await _retained_of(client, session.id)
    await _restores(client, kept.id, "failed-work\n")
    await client.delete_session(session.id)
    await client.delete_snapshot(kept.id)


async def test_delete_with_keep_snapshot_keeps_a_running_or_paused_session(plane: Plane) -> None:
    client = plane.client
    running = await _working_session(client, "running-work")
    kept = await client.delete_keeping(running.id)
    assert kept.retained
    assert kept.session_id == running.id
    assert (await client.get_session(running.id)).state == session_pb2.Session.DELETED
    assert (await _retained_of(client, running.id)).id == kept.id
    await _restores(client, kept.id, "running-work\n")

    paused = await _working_session(client, "paused-work")
    await client.pause(paused.id)
    kept_paused = await client.delete_keeping(paused.id)
    assert kept_paused.retained
    assert (await client.get_session(paused.id)).state == session_pb2.Session.DELETED
    await _restores(client, kept_paused.id, "paused-work\n")
    for snapshot in (kept, kept_paused):
        await client.delete_snapshot(snapshot.id)


purging = served_plane("docker", name="purging_plane", scope="function", pool={"size": 0},
                       lifetime={"reap_interval_s": 0.5, "retain_s": 2})


async def test_the_reaper_purges_a_retained_snapshot_after_retain_s(purging_plane: Plane) -> None:
    client = purging_plane.client
    session = await client.create_session(workspace_archive=tar_of({"work.txt": "short-lived\n"}))
    kept = await client.delete_keeping(session.id)
    assert kept.id in {s.id for s in await client.list_snapshots()}
    deadline = time.monotonic() + 15
    while kept.id in {s.id for s in await client.list_snapshots()}:
        assert time.monotonic() < deadline, "the retained snapshot was not purged"
        await asyncio.sleep(0.5)
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await client.create_session(from_snapshot=kept.id)
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
