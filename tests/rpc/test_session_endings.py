"""Ending a session when something fails or its caller goes away: nothing is left half done (in-process agents)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import pytest

from controlplane.core.seam.provider import SandboxProvider
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Session, SessionState
from controlplane.errors import SandboxLostError
from controlplane.v1 import session_pb2
from tests.planes import Plane, served_plane

plane = served_plane("local", scope="function")


def parts(plane: Plane) -> tuple[SessionManager, SandboxProvider]:
    sessions = plane.plane.sessions
    return sessions, sessions._provider


def before_destroy(provider: SandboxProvider, monkeypatch: pytest.MonkeyPatch,
                   first: Callable[[str], Awaitable[None]]) -> None:
    """The provider's sandbox removal, with `first` run before it (it may fail or take its time)."""
    destroy = provider.destroy

    async def destroy_after(sandbox_id: str) -> None:
        await first(sandbox_id)
        await destroy(sandbox_id)

    monkeypatch.setattr(provider, "destroy", destroy_after)


async def test_a_failed_sandbox_removal_keeps_the_session_and_the_reaper_retries(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, provider = parts(plane)
    session = await plane.client.create_session()
    failures = [RuntimeError("engine unreachable")]  # not a ControlPlaneError: once it killed the reaper

    async def fail_once(_: str) -> None:
        if failures:
            raise failures.pop()

    before_destroy(provider, monkeypatch, fail_once)
    clock = sessions._clock
    monkeypatch.setattr(sessions, "_clock", lambda: clock() + 10**7)  # long past every lifetime
    assert await sessions.reap_expired() == []
    assert not failures  # it was tried, and it failed
    assert session.id in sessions._live  # still held, so still this plane's to end
    assert (await plane.client.get_session(session.id)).state == session_pb2.Session.READY
    assert await sessions.reap_expired() == [session.id]
    ended = await plane.client.get_session(session.id)
    assert ended.state == session_pb2.Session.DELETED
    assert "expired" in ended.status_message
    with pytest.raises(SandboxLostError):
        await provider.get(session.sandbox_id)


async def test_a_delete_whose_caller_goes_away_still_finishes(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, provider = parts(plane)
    session = await plane.client.create_session()
    removing = asyncio.Event()

    async def slowly(_: str) -> None:
        removing.set()
        await asyncio.sleep(0.2)  # an engine taking its time to remove a container

    before_destroy(provider, monkeypatch, slowly)
    tenant = sessions._live[session.id].tenant
    deleting = asyncio.ensure_future(sessions.delete(tenant, session.id))
    await removing.wait()
    deleting.cancel()  # the client's deadline passed
    with pytest.raises(asyncio.CancelledError):
        await deleting
    for _ in range(100):
        if not sessions._ending:
            break
        await asyncio.sleep(0.02)
    assert (await plane.client.get_session(session.id)).state == session_pb2.Session.DELETED
    with pytest.raises(SandboxLostError):
        await provider.get(session.sandbox_id)


async def test_a_failed_final_write_leaves_no_sandbox(plane: Plane, monkeypatch: pytest.MonkeyPatch) -> None:
    sessions, provider = parts(plane)
    store = sessions._store
    put_session = store.put_session
    destroyed: list[str] = []

    async def refuse_ready(session: Session) -> None:
        if session.state == SessionState.READY:
            raise OSError("disk full")
        await put_session(session)

    async def note(sandbox_id: str) -> None:
        destroyed.append(sandbox_id)

    monkeypatch.setattr(store, "put_session", refuse_ready)
    before_destroy(provider, monkeypatch, note)
    before = set(sessions._live)
    with pytest.raises(grpc.aio.AioRpcError):
        await plane.client.create_session()
    assert set(sessions._live) == before
    assert len(destroyed) == 1
    with pytest.raises(SandboxLostError):
        await provider.get(destroyed[0])

