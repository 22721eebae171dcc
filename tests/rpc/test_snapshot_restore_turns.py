"""Restores (CreateSession from a snapshot) read the stored workspace whole into the plane's memory: they take one
of the plane's workspace-copy turns (`snapshots.max_concurrent_copies`) for as long as they hold it, so that many
concurrent restores of a large snapshot hold no more copies than that, on the local plane."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controlplane.core.sessions.models import Session
from controlplane.snapshots.fs_store import FsSnapshotStorage
from tests.archives import tar_of
from tests.planes import Plane, served_plane

plane = served_plane("local", scope="function", pool={"size": 0}, snapshots={"max_concurrent_copies": 1})


async def test_concurrent_restores_hold_one_workspace_at_a_time(plane: Plane,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    client = plane.client
    source = await client.create_session(workspace_archive=tar_of({"a.txt": "a\n"}))
    snapshot = await client.snapshot(source.id)
    events: list[str] = []
    read, create = FsSnapshotStorage.read, plane.plane.sessions.create

    async def noted_read(self: FsSnapshotStorage, tenant: str, snapshot_id: str) -> bytes:
        events.append("read")
        return await read(self, tenant, snapshot_id)

    async def noted_create(*args: Any, **kwargs: Any) -> Session:
        try:
            return await create(*args, **kwargs)
        finally:
            events.append("created")

    monkeypatch.setattr(FsSnapshotStorage, "read", noted_read)
    monkeypatch.setattr(plane.plane.sessions, "create", noted_create)
    restored = await asyncio.gather(*(client.create_session(from_snapshot=snapshot.id) for _ in range(3)))
    assert len({s.id for s in restored}) == 3
    assert events == ["read", "created"] * 3  # each read after the one before it was used and let go
