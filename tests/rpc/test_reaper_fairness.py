"""The reaper's idle pauses and expiries: a session whose agent never answers the workspace copy they take holds up
no other tenant's, nor do such agents in as many tenants as there are copy turns hold up another tenant's snapshot
(in-process agents; the hostile one is the real agent with its DownloadWorkspace held)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.core.sessions import copy_pace, pausing, workspace_spool
from controlplane.core.sessions.models import SessionState
from controlplane.v1 import session_pb2
from sandbox_agent.server import SandboxAgentService
from tests.planes import new_instance, remove_data_dir, remove_instance_leftovers, running_plane, short_tmp

TENANTS = [{"name": "alpha", "token": "reaper-alpha-token"}, {"name": "beta", "token": "reaper-beta-token"},
           {"name": "gamma", "token": "reaper-gamma-token"}]
HOSTILE = "HOSTILE"
"""A workspace holding this file is one whose agent leaves DownloadWorkspace unanswered (until released)."""


class HeldDownloads:
    def __init__(self) -> None:
        self.asked = asyncio.Event()
        """Set once a hostile workspace's download has begun (and is held)."""
        self.released = asyncio.Event()
        """Held downloads go on once set (at the end of a test, so that the plane stops at once)."""
        self.count = 0
        """Hostile workspaces' downloads begun."""


@pytest.fixture
def held_downloads(monkeypatch: pytest.MonkeyPatch) -> HeldDownloads:
    held = HeldDownloads()
    real = SandboxAgentService.DownloadWorkspace

    async def download(self: SandboxAgentService, request: Any, context: Any) -> AsyncIterator[Any]:
        if (Path(self._config.workspace) / HOSTILE).exists():
            held.count += 1
            held.asked.set()
            await held.released.wait()
        async for piece in real(self, request, context):
            yield piece

    monkeypatch.setattr(SandboxAgentService, "DownloadWorkspace", download)
    return held


async def state_within(client: AsyncClient, session_id: str, wanted: int, seconds: float) -> float:
    """How long `session_id` took to reach `wanted`; fails after `seconds`."""
    start = time.monotonic()
    while (state := (await client.get_session(session_id)).state) != wanted:
        assert time.monotonic() - start < seconds, f"still {session_pb2.Session.State.Name(state)} after {seconds} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - start


@pytest.mark.parametrize(("lifetime", "ends_as", "within_s"), [
    # Idle 1 s, then the next round: in turn behind alpha's pause, 120 s later (workspace_spool.PIECE_WAIT_S).
    pytest.param({"pause_after_idle_s": 1, "idle_timeout_s": 600, "reap_interval_s": 0.2},
                 session_pb2.Session.PAUSED, 6, id="idle-pause"),
    # Its workspace kept, then deleted: in turn behind alpha's kept copy, up to pausing.SALVAGE_TIMEOUT_S later.
    pytest.param({"idle_timeout_s": 1.5, "retain_s": 60, "reap_interval_s": 0.2},
                 session_pb2.Session.DELETED, 8, id="expiry-kept-copy"),
])
async def test_a_stalled_workspace_copy_holds_up_no_other_tenants_pause_or_expiry(
    held_downloads: HeldDownloads, lifetime: dict[str, float], ends_as: int, within_s: float
) -> None:
    async with running_plane("local", tenants=TENANTS, lifetime=lifetime) as plane:
        alpha = AsyncClient(plane.plane.address, TENANTS[0]["token"])
        beta = AsyncClient(plane.plane.address, TENANTS[1]["token"])
        try:
            stalled = await alpha.create_session()
            await alpha.run(stalled.id, ["bash", "-c", f"touch {HOSTILE}"])
            await asyncio.sleep(0.5)  # alpha's session comes due first, and its copy is the one the reaper is in
            idle = await beta.create_session()
            await beta.run(idle.id, ["true"])
            await state_within(beta, idle.id, ends_as, within_s)
            if ends_as == session_pb2.Session.DELETED:
                assert [s for s in await beta.list_snapshots() if s.session_id == idle.id and s.retained]
            assert (await alpha.get_session(stalled.id)).state == session_pb2.Session.READY  # its copy still waits
            assert plane.plane.sessions.reaping.busy(stalled.id)  # and no later round started another
        finally:
            held_downloads.released.set()
            await alpha.close()
            await beta.close()


async def test_a_plane_stopped_mid_pause_stops_at_once_and_leaves_the_session_ready(
    held_downloads: HeldDownloads
) -> None:
    data_dir, instance = short_tmp(), new_instance()
    settings = load_settings(None, data_dir=data_dir, instance=instance, provider={"type": "local"},
                             server={"listen": "127.0.0.1:0"}, tenants=TENANTS,
                             lifetime={"pause_after_idle_s": 1, "idle_timeout_s": 600, "reap_interval_s": 0.2})
    plane = await app.start(settings)
    try:
        async with AsyncClient(plane.address, TENANTS[0]["token"]) as alpha:
            stalled = await alpha.create_session()
            await alpha.run(stalled.id, ["bash", "-c", f"touch {HOSTILE}"])
        await asyncio.wait_for(held_downloads.asked.wait(), 10)  # the reaper's pause of it is in its copy
        assert plane.sessions.reaping.busy(stalled.id)
        start = time.monotonic()
        await app.stop(plane)  # the pause in flight is cancelled, not waited for (120 s)
        assert time.monotonic() - start < 10
        with contextlib.closing(sqlite3.connect(data_dir / "controlplane.db")) as db:
            states = db.execute("SELECT state FROM sessions WHERE id = ?", (stalled.id,)).fetchall()
        assert [SessionState(state) for (state,) in states] == [SessionState.READY]  # adopted again at a restart
        assert not list((data_dir / "snapshots").rglob("*snap_*"))  # no paused copy left half written
    finally:
        held_downloads.released.set()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_a_session_whose_copy_lapsed_is_not_paused_again_soon(
    held_downloads: HeldDownloads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked again after each retry interval, its agent held a copy turn each time: with such agents in two
    tenants, every other tenant's copies waited for good."""
    monkeypatch.setattr(workspace_spool, "FIRST_PIECE_WAIT_S", 0.5)
    monkeypatch.setattr(pausing, "RETRY_PAUSE_S", 0.3)
    lifetime = {"pause_after_idle_s": 0.5, "idle_timeout_s": 600, "reap_interval_s": 0.1}
    async with running_plane("local", tenants=TENANTS, lifetime=lifetime) as plane:
        alpha = AsyncClient(plane.plane.address, TENANTS[0]["token"])
        try:
            stalled = await alpha.create_session()
            await alpha.run(stalled.id, ["bash", "-c", f"touch {HOSTILE}"])
            await asyncio.wait_for(held_downloads.asked.wait(), 10)
            await asyncio.sleep(3)  # the lapse, then ten retry intervals
            assert held_downloads.count == 1
            assert not plane.plane.sessions.reaping.busy(stalled.id)  # the copy was given up, not still waiting
            assert (await alpha.get_session(stalled.id)).state == session_pb2.Session.READY
        finally:
            held_downloads.released.set()
            await alpha.close()


async def test_stalled_copies_in_two_tenants_hold_up_another_tenants_snapshot_for_stall_s_at_most(
    held_downloads: HeldDownloads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compromised agents of alpha and gamma that leave their snapshots' downloads unanswered held both of the
    plane's copy turns (snapshots.max_concurrent_copies) for FIRST_PIECE_WAIT_S, 30 s, and beta's snapshot waited;
    now one gives its turn up once beta waits and it has sent nothing for copy_pace.STALL_S."""
    monkeypatch.setattr(copy_pace, "STALL_S", 1.0)
    async with running_plane("local", tenants=TENANTS) as plane:
        alpha, beta, gamma = (AsyncClient(plane.plane.address, t["token"]) for t in TENANTS)
        try:
            stalling = []
            for hostile in (alpha, gamma):
                session = await hostile.create_session()
                await hostile.run(session.id, ["bash", "-c", f"touch {HOSTILE}"])
                stalling.append(asyncio.ensure_future(hostile.snapshot(session.id)))
            honest = await beta.create_session()
            await beta.run(honest.id, ["bash", "-c", "echo kept > notes.txt"])
            for _ in range(400):  # until both turns are held by downloads that send nothing
                if held_downloads.count == 2:
                    break
                await asyncio.sleep(0.05)
            assert held_downloads.count == 2
            start = time.monotonic()
            taken = await beta.snapshot(honest.id, deadline_s=20)
            assert time.monotonic() - start < 1.0 + 3  # 30 s before (FIRST_PIECE_WAIT_S)
            assert taken.session_id == honest.id
            # The first stalled copy to give its turn up let beta in; the other, no longer pressed, waits on alone.
            held_downloads.released.set()
            ends = await asyncio.gather(*stalling, return_exceptions=True)
            lapsed = [e for e in ends if isinstance(e, grpc.aio.AioRpcError)]
            assert lapsed
            assert all(e.code() == grpc.StatusCode.UNAVAILABLE for e in lapsed)
            assert all("while other tenants' copies waited" in (e.details() or "") for e in lapsed)
        finally:
            held_downloads.released.set()
            for client in (alpha, beta, gamma):
                await client.close()
