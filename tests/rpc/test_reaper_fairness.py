"""The reaper's idle pauses and expiries: a session whose agent never answers the workspace copy they take holds up
no other tenant's (in-process agents; the hostile one is the real agent with its DownloadWorkspace held)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from sandbox_agent.server import SandboxAgentService
from tests.planes import Plane, running_plane

TENANTS = [{"name": "alpha", "token": "reaper-alpha-token"}, {"name": "beta", "token": "reaper-beta-token"}]
HOSTILE = "HOSTILE"
"""A workspace holding this file is one whose agent leaves DownloadWorkspace unanswered (until released)."""


@pytest.fixture
def held_downloads(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Held downloads go on once the event is set (at the end of a test, so that the plane stops at once)."""
    released = asyncio.Event()
    real = SandboxAgentService.DownloadWorkspace

    async def held(self: SandboxAgentService, request: Any, context: Any) -> AsyncIterator[Any]:
        if (Path(self._config.workspace) / HOSTILE).exists():
            await released.wait()
        async for piece in real(self, request, context):
            yield piece

    monkeypatch.setattr(SandboxAgentService, "DownloadWorkspace", held)
    return released


async def state_within(client: AsyncClient, session_id: str, wanted: int, seconds: float) -> float:
    """How long `session_id` took to reach `wanted`; fails after `seconds`."""
    start = time.monotonic()
    while (state := (await client.get_session(session_id)).state) != wanted:
        assert time.monotonic() - start < seconds, f"still {session_pb2.Session.State.Name(state)} after {seconds} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - start


async def stalled_alpha_and_idle_beta(plane: Plane, released: asyncio.Event,
                                      check: Callable[[AsyncClient, str, str], Any]) -> None:
    alpha = AsyncClient(plane.plane.address, TENANTS[0]["token"])
    beta = AsyncClient(plane.plane.address, TENANTS[1]["token"])
    try:
        stalled = await alpha.create_session()
        await alpha.run(stalled.id, ["bash", "-c", f"touch {HOSTILE}"])
        await asyncio.sleep(0.5)  # alpha's session comes due first, and its copy is the one the reaper is in
        idle = await beta.create_session()
        await beta.run(idle.id, ["true"])
        await check(beta, idle.id, stalled.id)
        assert (await alpha.get_session(stalled.id)).state == session_pb2.Session.READY  # its copy still waits
        assert plane.plane.sessions.reaping.busy(stalled.id)
    finally:
        released.set()
        await alpha.close()
        await beta.close()


async def test_a_stalled_pause_holds_up_no_other_tenants_idle_pause(held_downloads: asyncio.Event) -> None:
    lifetime = {"pause_after_idle_s": 1, "idle_timeout_s": 600, "reap_interval_s": 0.2}
    async with running_plane("local", tenants=TENANTS, lifetime=lifetime) as plane:

        async def paused_in_time(beta: AsyncClient, idle: str, stalled: str) -> None:
            # Idle 1 s, then the next round: without its own task, 120 s behind alpha's (PIECE_WAIT_S).
            await state_within(beta, idle, session_pb2.Session.PAUSED, 6)

        await stalled_alpha_and_idle_beta(plane, held_downloads, paused_in_time)


async def test_a_stalled_kept_copy_holds_up_no_other_tenants_expiry(held_downloads: asyncio.Event) -> None:
    lifetime = {"idle_timeout_s": 1.5, "retain_s": 60, "reap_interval_s": 0.2}
    async with running_plane("local", tenants=TENANTS, lifetime=lifetime) as plane:

        async def deleted_in_time(beta: AsyncClient, idle: str, stalled: str) -> None:
            # Its workspace kept, then deleted: without its own task, up to SALVAGE_TIMEOUT_S behind alpha's.
            await state_within(beta, idle, session_pb2.Session.DELETED, 8)
            kept = [s for s in await beta.list_snapshots() if s.session_id == idle]
            assert kept, "the expired session's workspace was kept"

        await stalled_alpha_and_idle_beta(plane, held_downloads, deleted_in_time)
