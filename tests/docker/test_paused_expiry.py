"""A pause does not last for ever, through the public API on Docker sandboxes: a session paused past
lifetime.max_paused_s ends as expired, and its stored workspace becomes a retained snapshot that restores (files
and todos) on a new container."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import Plane, instance_containers, served_plane

pytestmark = pytest.mark.docker

plane = served_plane("docker", pool={"size": 0},
                     lifetime={"reap_interval_s": 0.25, "max_paused_s": 3, "retain_s": 3600})
TODOS = [{"content": "Outlive the pause", "status": "pending", "priority": "low"}]


async def test_a_session_paused_too_long_ends_and_its_workspace_restores(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(workspace_archive=tar_of({"work.txt": "paused on docker\n"}))
    await client.execute_tool(session.id, "todowrite", {"todos": TODOS})
    await client.pause(session.id)
    deadline = time.monotonic() + 30
    while (ended := await client.get_session(session.id)).state != session_pb2.Session.DELETED:
        assert ended.state == session_pb2.Session.PAUSED
        assert time.monotonic() < deadline, "the paused session did not expire"
        await asyncio.sleep(0.25)
    assert ended.status_message == "expired: paused for 3 s"
    assert not [c for c in instance_containers(plane.instance) if c.labels.get("ocsb.session") == session.id]
    [kept] = [s for s in await client.list_snapshots() if s.session_id == session.id]
    assert kept.retained
    restored = await client.create_session(from_snapshot=kept.id)
    try:
        assert await client.read_file(restored.id, "work.txt") == b"paused on docker\n"
        assert json.loads((await client.execute_tool(restored.id, "todoread", {})).output) == TODOS
    finally:
        await client.delete_session(restored.id)
        await client.delete_snapshot(kept.id)
