"""The resume claim of a PAUSED session, against SQLite and a real PostgreSQL server (as the store contract): of
several control planes on one store claiming it at once exactly one gets it, only its holder stores it READY, and
a claim is released, taken back by its plane after a restart, taken over when stale, and cleared by a whole write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.store.base import Store, open_store

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
Opener = Callable[[], Awaitable[Store]]


@pytest.fixture(params=KINDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens a store on one database (a fresh SQLite file or PostgreSQL database), as each control plane would."""
    url = str(request.getfixturevalue("pg_url")) if request.param == "postgres" else f"sqlite://{tmp_path / 's.db'}"

    async def open_() -> Store:
        return await open_store(url, tmp_path)

    return open_


@pytest.fixture
async def store(opener: Opener) -> AsyncIterator[Store]:
    opened = await opener()
    yield opened
    await opened.aclose()


def _session(sid: str, **kw: Any) -> Session:
    return Session(id=sid, tenant="acme", agent="build", state=kw.pop("state", SessionState.READY),
                   resources=Resources(0.5, 256, 128), created_at=1.5, last_active_at=1.75, **kw)


async def test_of_two_stores_claiming_one_paused_session_at_once_exactly_one_gets_it(opener: Opener) -> None:
    first, second = await opener(), await opener()  # two control planes on one database
    try:
        await first.put_session(_session("ses_p", state=SessionState.PAUSED))
        for _ in range(5):  # a race each time: the conditional update lets one through
            got = await asyncio.gather(first.claim_paused("ses_p", "plane-a", 10.0, 0.0),
                                       second.claim_paused("ses_p", "plane-b", 10.0, 0.0))
            assert got[0] == got[1]
            assert got[0] in ("plane-a", "plane-b")
            await first.release_claim("ses_p", got[0])
        # Held by A: B is told who holds it, and cannot store it READY; A can, and that ends the claim.
        assert await first.claim_paused("ses_p", "plane-a", 20.0, 0.0) == "plane-a"
        assert await second.claim_paused("ses_p", "plane-b", 21.0, 0.0) == "plane-a"
        resumed = _session("ses_p", sandbox_id="sbx_a")
        resumed.last_active_at = 22.0
        assert not await second.put_resumed(_session("ses_p", sandbox_id="sbx_b"), "plane-b")
        assert await first.put_resumed(resumed, "plane-a")
        back = await second.get_session("ses_p")
        assert back is not None
        assert (back.state, back.sandbox_id, back.last_active_at) == (SessionState.READY, "sbx_a", 22.0)
        # A READY session cannot be claimed, nor stored READY again by a claim's holder.
        assert await second.claim_paused("ses_p", "plane-b", 23.0, 0.0) == ""
        assert not await first.put_resumed(resumed, "plane-a")
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_resume_claim_is_released_taken_over_when_stale_and_cleared_by_a_whole_write(store: Store) -> None:
    await store.put_session(_session("ses_p", state=SessionState.PAUSED))
    assert await store.claim_paused("ses_p", "plane-a", 100.0, 0.0) == "plane-a"
    assert await store.claim_paused("ses_p", "plane-a", 101.0, 0.0) == "plane-a"  # A restarted: its own claim
    assert await store.claim_paused("ses_p", "plane-b", 150.0, 50.0) == "plane-a"  # not stale yet
    assert await store.claim_paused("ses_p", "plane-b", 500.0, 200.0) == "plane-b"  # A stopped: B takes over
    assert not await store.put_resumed(_session("ses_p", sandbox_id="sbx_a"), "plane-a")  # overtaken: refused
    await store.release_claim("ses_p", "plane-a")  # not A's any more: changes nothing
    assert await store.claim_paused("ses_p", "plane-c", 501.0, 0.0) == "plane-b"
    await store.release_claim("ses_p", "plane-b")
    assert await store.claim_paused("ses_p", "plane-c", 502.0, 0.0) == "plane-c"
    await store.put_session(_session("ses_p", state=SessionState.DELETED, deleted_at=503.0))  # deleted meanwhile
    assert not await store.put_resumed(_session("ses_p", sandbox_id="sbx_c"), "plane-c")
    assert await store.claim_paused("ses_p", "plane-c", 504.0, 0.0) == ""
    await store.put_session(_session("ses_q", state=SessionState.PAUSED))
    assert await store.claim_paused("ses_q", "plane-a", 600.0, 0.0) == "plane-a"
    await store.put_session(_session("ses_q", state=SessionState.PAUSED))  # paused again, written whole
    assert await store.claim_paused("ses_q", "plane-b", 601.0, 0.0) == "plane-b"
    assert await store.claim_paused("ses_missing", "plane-a", 602.0, 0.0) == ""



async def test_a_session_deleted_through_one_plane_is_never_written_back_by_another(opener: Opener) -> None:
    # Plane B deletes a session while plane A, which holds it, is pausing it: A's whole write of PAUSED comes last
    # and must not bring back a session whose delete was answered (its workspace already removed).
    first, second = await opener(), await opener()
    try:
        await first.put_session(_session("ses_d"))
        deleted = _session("ses_d", state=SessionState.DELETED, status_message="deleted")
        deleted.deleted_at = 30.0
        await second.put_session(deleted)
        await first.put_session(_session("ses_d", state=SessionState.PAUSED, status_message="call ResumeSession"))
        back = await first.get_session("ses_d")
        assert back is not None
        assert (back.state, back.status_message, back.deleted_at) == (SessionState.DELETED, "deleted", 30.0)
        assert [s.id for s in await first.list_sessions("acme", live_only=True, with_paused=True)] == []
    finally:
        await first.aclose()
        await second.aclose()
