"""The filesystem snapshot storage's stored-bytes figure, read on every quota admission: right as snapshots come and
go, and without reading a record it has read before (its size cache)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.core.sessions.snapshots import Snapshot, SnapshotState
from controlplane.snapshots.fs_store import FsSnapshotStorage


def _state(kind: str) -> SnapshotState:
    session = Session(id="ses_1", tenant="acme", agent="build", state=SessionState.READY,
                      resources=Resources(0.5, 256, 64), created_at=1.0, last_active_at=1.0)
    return SnapshotState(session.agent, "", "default", {}, session.resources, None, kind=kind)


async def _data(size: int) -> AsyncIterator[bytes]:
    yield os.urandom(size)


class _Counting(FsSnapshotStorage):
    """The real storage, counting the records it reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.loads = 0

    def _load(self, record: Path) -> Snapshot | None:
        self.loads += 1
        return super()._load(record)


async def test_stored_bytes_sums_every_kind_and_reads_each_record_once(tmp_path: Path) -> None:
    storage = _Counting(tmp_path)
    assert await storage.stored_bytes("acme") == 0  # no directory yet
    made = [await storage.write("acme", "snap_" + f"{i:02x}" * 12, "ses_1", _state(kind), _data(50_000))
            for i, kind in enumerate(("taken", "paused", "retained"))]
    await storage.write("other", "snap_" + "ff" * 12, "ses_2", _state("taken"), _data(70_000))
    storage.loads = 0
    assert await storage.stored_bytes("acme") == sum(s.size_bytes for s in made)
    assert storage.loads == 3
    assert await storage.stored_bytes("acme") == sum(s.size_bytes for s in made)
    assert storage.loads == 3  # cached: a second admission reads no record
    await storage.delete("acme", made[0].id)
    assert await storage.stored_bytes("acme") == made[1].size_bytes + made[2].size_bytes
    newer = await storage.write("acme", "snap_" + "aa" * 12, "ses_1", _state("taken"), _data(10_000))
    assert await storage.stored_bytes("acme") == made[1].size_bytes + made[2].size_bytes + newer.size_bytes
    assert storage.loads == 3 + 1  # only the new record was read
    assert await FsSnapshotStorage(tmp_path).stored_bytes("other") > 70_000  # tenants apart
