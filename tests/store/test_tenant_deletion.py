"""DeleteTenant leaves nothing for a new tenant of the same name, over real gRPC, on SQLite and PostgreSQL;
a delete a stop interrupted is finished at the next start."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from controlplane import app
from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.v1 import tool_pb2
from tests.planes import new_instance, remove_data_dir, short_tmp

ASK_GIT = json.dumps({"permission": {"bash": {"*": "allow", "git *": "ask"}}})
TODOS = [{"content": "Leave nothing behind", "status": "in_progress", "priority": "high"}]
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@asynccontextmanager
async def local_plane(data_dir: Path, url: str, tenants: list[dict[str, str]] | None = None) -> AsyncIterator[
    app.ControlPlane
]:
    settings = load_settings(None, data_dir=data_dir, instance=new_instance(), provider={"type": "local"},
                             server={"listen": "127.0.0.1:0"}, pool={"size": 0}, store={"url": url},
                             tenants=tenants or [{"name": "alpha", "token": "token-alpha"}])
    plane = await app.start(settings)
    try:
        yield plane
    finally:
        await app.stop(plane)


def admin_of(plane: app.ControlPlane) -> AsyncAdminClient:
    return AsyncAdminClient(plane.address, plane.settings.admin_token_file.read_text().strip())


async def _store_url(kind: str, request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pg_url")) if kind == "postgres" else ""


async def _leave_traces(client: AsyncClient, plane: app.ControlPlane) -> tuple[str, str]:
    """A session with an ALWAYS approval, todos, a pending ask and calls; a deleted one beside it."""
    kept = await client.create_session(config_json=ASK_GIT)
    gone = await client.create_session()
    await client.delete_session(gone.id)

    async def always(_: object) -> tuple[int, str]:
        return tool_pb2.PermissionReply.ALWAYS, ""

    assert (await client.execute_tool(kept.id, "bash", {"command": "git status || true", "description": "g"},
                                      on_permission=always)).error is None
    assert (await client.execute_tool(kept.id, "todowrite", {"todos": TODOS})).error is None
    stream, _ = client.tool_call(kept.id, "bash", {"command": "git log || true", "description": "asks"})
    async for event in stream:  # ALWAYS approved `git status *` only: this one asks, and stays pending
        if event.WhichOneof("event") == "permission_request":
            break
    assert len(await client.pending_permissions(kept.id)) == 1
    assert await plane.store.load_approvals(kept.id) != []
    assert await plane.store.get_todos(kept.id) != []
    stream.cancel()
    return kept.id, gone.id


async def _sees_nothing(again: AsyncClient, admin: AsyncAdminClient, old: tuple[str, str]) -> None:
    assert await again.list_sessions(include_deleted=True) == []
    for session_id in old:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await again.get_session(session_id)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await again.pending_permissions(session_id)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    usage = await admin.usage("reborn")
    assert (usage.sessions, usage.calls, usage.calls_started, usage.subscriptions) == (0, 0, 0, 0)


@pytest.mark.parametrize("kind", STORES)
async def test_a_tenant_made_again_under_a_deleted_ones_name_sees_nothing_of_it(
    kind: str, request: pytest.FixtureRequest,
) -> None:
    data_dir = short_tmp()
    try:
        async with local_plane(data_dir, await _store_url(kind, request)) as plane, admin_of(plane) as admin:
            made = await admin.create_tenant("reborn")
            async with AsyncClient(plane.address, made.token) as first:
                old = await _leave_traces(first, plane)
                events = first.subscribe_events()
                await events.initial_metadata()
            await admin.delete_tenant("reborn")
            remade = await admin.create_tenant("reborn")
            async with AsyncClient(plane.address, remade.token) as again:
                await _sees_nothing(again, admin, old)
                subscription = again.subscribe_events()
                await subscription.initial_metadata()
                fresh = await again.create_session()
                seen = await asyncio.wait_for(anext(aiter(subscription)), 5)
                assert (seen.type, seen.session_id) == ("session.created", fresh.id)  # nothing of the old bus
                subscription.cancel()
                assert [s.id for s in await again.list_sessions(include_deleted=True)] == [fresh.id]
                await again.delete_session(fresh.id)
            for session_id in old:  # in the store: no record, approval or todo; the operator's audit stays
                assert await plane.store.get_session(session_id) is None
                assert await plane.store.load_approvals(session_id) == []
                assert await plane.store.get_todos(session_id) == []
            await plane.audit.flush()
            assert {e.session_id for e in await plane.store.audit_entries("reborn")} >= {old[0]}
    finally:
        remove_data_dir(data_dir)


async def test_a_delete_interrupted_by_a_stop_is_finished_at_the_next_start() -> None:
    data_dir = short_tmp()
    declared = [{"name": "alpha", "token": "token-alpha"}, {"name": "kept", "token": "token-kept"}]
    try:
        async with local_plane(data_dir, "", declared) as plane:
            async with AsyncClient(plane.address, "token-kept") as kept:
                session = await kept.create_session()
            async with admin_of(plane) as admin:
                made = await admin.create_tenant("halfway")
            async with AsyncClient(plane.address, made.token) as halfway:
                theirs = await halfway.create_session()
            # DeleteTenant's first step, then the plane stops: both tenants are marked, nothing else is done
            for name in ("kept", "halfway"):
                await plane.store.mark_tenant_deleting(name, time.time())
        async with local_plane(data_dir, "", declared) as plane:
            async with admin_of(plane) as admin:
                assert sorted(t.name for t in await admin.list_tenants()) == ["alpha", "kept"]
            async with AsyncClient(plane.address, made.token) as halfway:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await halfway.list_sessions()
                assert (info.value.code(), info.value.details()) == (
                    grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token"
                )
            stored = await plane.store.get_session(theirs.id)
            assert stored is not None
            assert stored.state.value == "DELETED"
            assert plane.sessions.live_session(theirs.id) is None
            async with AsyncClient(plane.address, "token-kept") as kept:  # declared: made again from nothing
                assert await kept.list_sessions(include_deleted=True) == []
            assert await plane.store.get_session(session.id) is None
    finally:
        remove_data_dir(data_dir)
