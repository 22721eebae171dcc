"""A FAILED session's workspace salvage given up on midway (pausing.py's SALVAGE_TIMEOUT_S, made short here) on
a real engine: the session ends without a retained snapshot, the never-started container reading its volume goes
at once, not when the read would have ended, no spooled file stays, and deleting the session removes its volume."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from controlplane.core.sessions import pausing
from controlplane.v1 import session_pb2
from tests.bench.snapshot_bench import MAKE_TREE
from tests.planes import Plane, instance_containers, instance_volumes, served_plane

pytestmark = pytest.mark.docker
plane = served_plane("docker", pool={"size": 0}, lifetime={"reap_interval_s": 0.5, "retain_s": 3600})


@pytest.fixture
def short_salvage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pausing, "SALVAGE_TIMEOUT_S", 0.3)  # the plane runs in this process


def _salvage_containers(instance: str) -> list[Any]:
    return [c for c in instance_containers(instance) if not c.labels.get("ocsb.sandbox")]


async def test_a_salvage_given_up_on_leaves_no_container_file_or_volume(plane: Plane, short_salvage: None) -> None:
    client = plane.client
    session = await client.create_session()
    for part in ("a", "b", "c"):  # 300 MiB: the engine's copy of it takes seconds, far past the 0.3 s allowed
        made = await client.run(session.id, ["python3", "-c", MAKE_TREE, f"/workspace/{part}"])
        assert made.exit_code == 0, made.stderr
    [container] = [c for c in instance_containers(plane.instance) if c.labels.get("ocsb.sandbox") == session.sandbox_id]
    await asyncio.to_thread(container.kill)
    with pytest.raises(grpc.aio.AioRpcError):
        await client.run(session.id, command="true")
    deadline = time.monotonic() + 30
    while (await client.get_session(session.id)).state != session_pb2.Session.FAILED:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert [s for s in await client.list_snapshots() if s.session_id == session.id] == []  # given up on
    deadline = time.monotonic() + 1.5
    while _salvage_containers(plane.instance):
        assert time.monotonic() < deadline, "the salvage container outlived its salvage"
        await asyncio.sleep(0.1)
    salvage_dir = plane.plane.settings.data_dir / "salvage" / plane.instance
    deadline = time.monotonic() + 5
    while salvage_dir.is_dir() and list(salvage_dir.iterdir()):
        assert time.monotonic() < deadline, list(salvage_dir.iterdir())
        await asyncio.sleep(0.1)
    await client.delete_session(session.id)
    assert not [v for v in instance_volumes(plane.instance) if session.sandbox_id in (v.name or "")]
    assert not _salvage_containers(plane.instance)
