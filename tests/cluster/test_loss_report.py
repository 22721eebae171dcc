"""What the Swarm provider writes to the store when a sandbox is lost (no swarm needed: a real SQLite store)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.config import PoolConfig, ResourcesConfig, SwarmProviderConfig
from controlplane.core.seam.provider import SandboxRecord, SandboxState
from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.sandbox.swarm.provider import SwarmSandboxProvider
from controlplane.store.sqlite import SqliteStore

pytestmark = pytest.mark.cluster
INSTANCE = "loss-test"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "store.db")
    yield s
    await s.aclose()


def provider(tmp_path: Path, ledger: object) -> SwarmSandboxProvider:
    return SwarmSandboxProvider(
        SwarmProviderConfig(type="swarm"), PoolConfig(size=0), ResourcesConfig(), tmp_path, INSTANCE,
        ledger,  # type: ignore[arg-type]
    )


async def session(store: SqliteStore, session_id: str, sandbox_id: str, state: SessionState,
                  record: SandboxState = "claimed") -> None:
    await store.put_session(Session(session_id, "acme", "build", state, Resources(1, 1024, 512), 1.0, 2.0,
                                    sandbox_id=sandbox_id, status_message="before"))
    await store.put_sandbox(SandboxRecord(sandbox_id, INSTANCE, record, session_id if record == "claimed" else ""))


async def test_a_lost_sandbox_fails_its_ready_session_and_nothing_else(tmp_path: Path, store: SqliteStore) -> None:
    await session(store, "s-ready", "aaa", SessionState.READY)
    await session(store, "s-deleted", "bbb", SessionState.DELETED)
    await session(store, "s-moved", "ccc", SessionState.READY)
    await store.put_sandbox(SandboxRecord("ddd", INSTANCE, "pool"))
    p = provider(tmp_path, store)
    try:
        for sandbox_id in ("aaa", "bbb", "ddd", "zzz"):
            await p._report_lost(sandbox_id, f"sandbox {sandbox_id} is lost: its node n1 stopped answering")
        # A record pointing at a session whose row names another sandbox: that session is not touched.
        await store.put_sandbox(SandboxRecord("eee", INSTANCE, "claimed", "s-moved"))
        await p._report_lost("eee", "sandbox eee is lost: its task is no longer running")
    finally:
        await p.close()
    ready, deleted, moved = [await store.get_session(i) for i in ("s-ready", "s-deleted", "s-moved")]
    assert ready is not None
    assert deleted is not None
    assert moved is not None
    assert (ready.state, ready.status_message) == (
        SessionState.FAILED, "sandbox aaa is lost: its node n1 stopped answering")
    assert (ready.sandbox_id, ready.tenant, ready.created_at, ready.last_active_at) == ("aaa", "acme", 1.0, 2.0)
    assert (deleted.state, deleted.status_message) == (SessionState.DELETED, "before")
    assert (moved.state, moved.status_message) == (SessionState.READY, "before")


class SandboxRecordsOnly:
    """A ledger without session rows (a provider used outside the app)."""

    def __init__(self) -> None:
        self.records = [SandboxRecord("aaa", INSTANCE, "claimed", "s1")]

    async def list_sandboxes(self, instance: str) -> list[SandboxRecord]:
        return self.records


async def test_a_ledger_without_session_rows_is_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = provider(tmp_path, SandboxRecordsOnly())
    try:
        with caplog.at_level(logging.DEBUG, logger="controlplane.sandbox.swarm"):
            await p._report_lost("aaa", "sandbox aaa is lost: its task is no longer running")
    finally:
        await p.close()
    assert [r.getMessage() for r in caplog.records if r.name == "controlplane.sandbox.swarm"] == []
