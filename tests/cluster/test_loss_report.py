"""A sandbox the Swarm provider finds lost: the provider reports it, the session manager decides what becomes of
its session (no swarm needed: a real SQLite store, and the local plane for a session this plane holds)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from controlplane.config import PoolConfig, ResourcesConfig, SwarmProviderConfig
from controlplane.core.seam.provider import LostSandbox, SandboxRecord, SandboxState
from controlplane.core.sessions.admission import SessionPolicy
from controlplane.core.sessions.events import BusEvent
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.errors import SandboxLostError
from controlplane.sandbox.swarm.provider import SwarmSandboxProvider
from controlplane.store.sqlite import SqliteStore
from controlplane.v1 import session_pb2
from tests.planes import running_plane

pytestmark = pytest.mark.cluster
INSTANCE = "loss-test"
POLICY = SessionPolicy(Resources(1, 1024, 512), Resources(2, 2048, 1024), 600.0, 3600.0, 60.0, 1 << 20)


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
    """Sessions this plane does not hold (another plane on the store may): their rows, as the store has them."""
    await session(store, "s-ready", "aaa", SessionState.READY)
    await session(store, "s-deleted", "bbb", SessionState.DELETED)
    await session(store, "s-moved", "ccc", SessionState.READY)
    await store.put_sandbox(SandboxRecord("ddd", INSTANCE, "pool"))
    p = provider(tmp_path, store)
    SessionManager(store, p, POLICY)  # subscribes to the provider's reports; holds no session
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
        self.records = [SandboxRecord("aaa", INSTANCE, "claimed", "s1"), SandboxRecord("ddd", INSTANCE, "pool")]

    async def list_sandboxes(self, instance: str) -> list[SandboxRecord]:
        return self.records


async def test_a_report_names_the_claiming_session_and_goes_to_every_listener(tmp_path: Path) -> None:
    p = provider(tmp_path, SandboxRecordsOnly())
    heard: list[tuple[str, LostSandbox]] = []

    async def listener(name: str, lost: LostSandbox) -> None:
        heard.append((name, lost))

    p.on_lost(lambda lost: listener("first", lost))
    p.on_lost(lambda lost: listener("second", lost))
    try:
        for sandbox_id in ("aaa", "ddd", "zzz"):
            await p._report_lost(sandbox_id, f"sandbox {sandbox_id} is lost: its task is no longer running")
    finally:
        await p.close()
    expected = [LostSandbox("aaa", "s1", "sandbox aaa is lost: its task is no longer running"),
                LostSandbox("ddd", "", "sandbox ddd is lost: its task is no longer running"),
                LostSandbox("zzz", "", "sandbox zzz is lost: its task is no longer running")]
    assert heard == [(name, lost) for lost in expected for name in ("first", "second")]


async def test_a_provider_nobody_listens_to_is_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = provider(tmp_path, SandboxRecordsOnly())
    try:
        with caplog.at_level(logging.DEBUG, logger="controlplane.sandbox.swarm"):
            await p._report_lost("aaa", "sandbox aaa is lost: its task is no longer running")
    finally:
        await p.close()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("controlplane.sandbox.swarm")] == []


async def test_a_lost_sandbox_of_a_session_this_plane_holds_ends_it_at_once() -> None:
    """What the manager subscribed to the provider does with a report (the local provider never reports one
    itself): the session fails with the provider's reason, its children with it, its sandbox goes."""
    async with running_plane("local") as plane:
        sessions = plane.plane.sessions
        doomed = await plane.client.create_session()
        child = await sessions.create_child(doomed.id, "build", "a child")
        other = await plane.client.create_session()
        failures: list[tuple[str, str]] = []

        async def record(event: BusEvent) -> None:
            if event.type == "session.failed":
                failures.append((event.session_id, event.properties["message"]))

        sessions.bus.listen(record)
        reason = f"sandbox {doomed.sandbox_id} is lost: its task is no longer running"
        # Reports that match no session held here, or name another sandbox, change nothing.
        await sessions._sandbox_lost(LostSandbox(doomed.sandbox_id, "", reason))
        await sessions._sandbox_lost(LostSandbox(doomed.sandbox_id, other.id, reason))
        assert (await plane.client.get_session(other.id)).state == session_pb2.Session.READY
        assert (await plane.client.get_session(doomed.id)).state == session_pb2.Session.READY
        await sessions._sandbox_lost(LostSandbox(doomed.sandbox_id, doomed.id, reason))
        failed = await plane.client.get_session(doomed.id)
        assert (failed.state, failed.status_message) == (session_pb2.Session.FAILED, reason)
        ended_child = await plane.client.get_session(child.id)
        assert (ended_child.state, ended_child.status_message) == (
            session_pb2.Session.FAILED, f"its parent session {doomed.id} ended ({reason})")
        with pytest.raises(SandboxLostError):
            await sessions._provider.get(doomed.sandbox_id)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await plane.client.run(doomed.id, ["true"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == f"session {doomed.id} is FAILED ({reason})"
        await sessions._sandbox_lost(LostSandbox(doomed.sandbox_id, doomed.id, reason))  # told twice: once is enough
        await asyncio.sleep(0.1)  # listeners run in the background
        assert sorted(failures) == sorted([(doomed.id, reason), (child.id, f"its parent session {doomed.id} ended "
                                                                          f"({reason})")])
        assert (await plane.client.run(other.id, ["echo", "alive"])).stdout == b"alive\n"
