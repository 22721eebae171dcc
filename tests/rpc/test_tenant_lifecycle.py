"""AdminService through the public API: tenants made, listed, rotated, revoked, expired and deleted, each
change holding from the next RPC on, and the TOML's tenants reconciled at start."""

from __future__ import annotations

import asyncio
import hashlib
import stat
import time
from typing import Any

import grpc
import pytest

from controlplane import app
from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.core.tenants.lifecycle import REFRESH_S
from controlplane.rpc.server import ADMIN_SERVICE
from tests.planes import Plane, new_instance, remove_data_dir, served_plane, short_tmp

TENANTS = [{"name": "alpha", "token": "token-alpha"}]


plane = served_plane("local", scope="function", tenants=TENANTS, pool={"size": 0})


def admin_of(plane: Plane) -> AsyncAdminClient:
    token = plane.plane.settings.admin_token_file.read_text().strip()
    return AsyncAdminClient(plane.plane.address, token)


async def refused(call: Any) -> str:
    """The details of the UNAUTHENTICATED status `call` (an awaitable) must end with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value.details()
    return info.value.details() or ""


async def test_the_admin_token_is_written_once_and_is_the_only_key_to_admin(plane: Plane) -> None:
    path = plane.plane.settings.admin_token_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert token.startswith("ocsb_")
    assert len(token) > 40
    async with AsyncAdminClient(plane.plane.address, plane.token) as tenant_as_admin:
        assert await refused(tenant_as_admin.list_tenants()) == "unknown admin token"
    async with AsyncAdminClient(plane.plane.address, "wrong") as stranger:
        assert await refused(stranger.create_tenant("mallory")) == "unknown admin token"
    async with AsyncClient(plane.plane.address, token) as admin_as_tenant:
        assert await refused(admin_as_tenant.list_sessions()) == "unknown bearer token"
    async with admin_of(plane) as admin:
        assert [t.name for t in await admin.list_tenants()] == ["alpha"]


async def test_a_created_tenant_works_at_once_and_is_listed(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        made = await admin.create_tenant("bob")
        assert made.token.startswith("ocsb_")
        assert (made.tenant.name, made.tenant.origin, made.tenant.revoked_at) == ("bob", "api", 0.0)
        async with AsyncClient(plane.plane.address, made.token) as bob:
            session = await bob.create_session()
            assert [s.id for s in await bob.list_sessions()] == [session.id]
            assert (await bob.run(session.id, ["echo", "hi"])).stdout == b"hi\n"
            await bob.delete_session(session.id)
        assert [(t.name, t.origin) for t in await admin.list_tenants()] == [("alpha", "config"), ("bob", "api")]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.create_tenant("bob")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.create_tenant("Not A Name")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_revoked_and_rotated_away_tokens_are_refused_on_the_next_rpc(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        made = await admin.create_tenant("bob")
        bob = AsyncClient(plane.plane.address, made.token)
        session = await bob.create_session()
        revoked = await admin.revoke_token("bob")
        assert revoked.revoked_at > 0
        assert await refused(bob.list_sessions()) == "bearer token revoked"
        assert await refused(bob.run(session.id, ["true"])) == "bearer token revoked"
        assert await refused(bob.execute_tool(session.id, "read", {"filePath": "a"})) == "bearer token revoked"
        assert await refused(anext(aiter(bob.subscribe_events()))) == "bearer token revoked"
        rotated = await admin.rotate_token("bob")  # a new token lifts the revocation; the old one stays dead
        assert rotated.token != made.token
        assert rotated.tenant.revoked_at == 0
        assert await refused(bob.list_sessions()) == "unknown bearer token"
        await bob.close()
        async with AsyncClient(plane.plane.address, rotated.token) as again:
            assert [s.id for s in await again.list_sessions()] == [session.id]
            await again.delete_session(session.id)


async def test_an_expired_token_is_refused(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        made = await admin.create_tenant("brief", ttl_s=1.0)
        assert made.tenant.expires_at > made.tenant.created_at
        async with AsyncClient(plane.plane.address, made.token) as brief:
            assert await brief.list_sessions() == []
            await asyncio.sleep(max(0.0, made.tenant.expires_at - time.time()) + 0.05)
            assert await refused(brief.list_sessions()) == "bearer token expired"
        renewed = await admin.rotate_token("brief")
        assert renewed.tenant.expires_at == 0
        async with AsyncClient(plane.plane.address, renewed.token) as brief:
            assert await brief.list_sessions() == []


async def test_deleting_a_tenant_deletes_its_sessions_and_its_token(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        made = await admin.create_tenant("gone")
        async with AsyncClient(plane.plane.address, made.token) as gone:
            first, second = await gone.create_session(), await gone.create_session()
            other = await plane.client.create_session()
            reply = await admin.delete_tenant("gone")
            assert sorted(reply.session_ids) == sorted([first.id, second.id])
            assert await refused(gone.list_sessions()) == "unknown bearer token"
        stored = {s.id: s.state.value for s in await plane.plane.store.list_sessions("gone")}
        assert stored == {first.id: "DELETED", second.id: "DELETED"}
        assert plane.plane.sessions.live_session(first.id) is None
        assert [t.name for t in await admin.list_tenants()] == ["alpha"]
        assert [s.id for s in await plane.client.list_sessions()] == [other.id]  # another tenant's stays
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin.usage("gone")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_tenant_removed_from_the_toml_is_revoked_at_the_next_start() -> None:
    data_dir = short_tmp()
    instance = new_instance()
    both = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]

    async def start(tenants: list[dict[str, str]]) -> app.ControlPlane:
        settings = load_settings(None, data_dir=data_dir, instance=instance, provider={"type": "local"},
                                 server={"listen": "127.0.0.1:0"}, pool={"size": 0}, tenants=tenants)
        return await app.start(settings)

    try:
        first = await start(both)
        admin_token = first.settings.admin_token_file.read_text()
        async with AsyncClient(first.address, "token-beta") as beta:
            assert await beta.list_sessions() == []
        await app.stop(first)
        second = await start(both[:1])
        try:
            assert second.settings.admin_token_file.read_text() == admin_token  # kept across restarts
            async with AsyncClient(second.address, "token-beta") as beta:
                assert await refused(beta.list_sessions()) == "bearer token revoked"
            async with AsyncClient(second.address, "token-alpha") as alpha:
                assert await alpha.list_sessions() == []
            async with AsyncAdminClient(second.address, admin_token.strip()) as admin:
                listed = {t.name: t.revoked_at > 0 for t in await admin.list_tenants()}
            assert listed == {"alpha": False, "beta": True}
        finally:
            await app.stop(second)
        third = await start(both)  # declared again: usable again
        try:
            async with AsyncClient(third.address, "token-beta") as beta:
                assert await beta.list_sessions() == []
        finally:
            await app.stop(third)
    finally:
        remove_data_dir(data_dir)


async def _until_refused(client: AsyncClient, want: bool) -> None:
    deadline = time.monotonic() + 3 * REFRESH_S + 2
    while True:
        try:
            await client.list_sessions()
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED)
        now_refused = code == grpc.StatusCode.UNAUTHENTICATED
        if now_refused == want:
            return
        assert time.monotonic() < deadline, "the change was not picked up"
        await asyncio.sleep(0.1)


async def test_a_change_made_by_another_control_plane_on_the_store_is_picked_up(plane: Plane) -> None:
    """A revocation written straight to the store (as a second control plane sharing it would) holds
    after the next background refresh, without a restart."""
    await plane.plane.store.revoke_tenant("alpha", time.time())
    await _until_refused(plane.client, True)
    assert await refused(plane.client.list_sessions()) == "bearer token revoked"
    await plane.plane.store.put_tenant("alpha", hashlib.sha256(b"token-alpha").hexdigest())
    await _until_refused(plane.client, False)


async def test_the_generated_default_tenant_is_revoked_once_the_toml_declares_tenants() -> None:
    data_dir = short_tmp()
    instance = new_instance()

    async def start(tenants: list[dict[str, str]]) -> app.ControlPlane:
        settings = load_settings(None, data_dir=data_dir, instance=instance, provider={"type": "local"},
                                 server={"listen": "127.0.0.1:0"}, pool={"size": 0}, tenants=tenants)
        return await app.start(settings)

    try:
        first = await start([])
        default_token = first.settings.token_file.read_text().strip()
        await app.stop(first)
        second = await start([])  # restarted as it was: the same default token still works
        try:
            async with AsyncClient(second.address, default_token) as default:
                assert await default.list_sessions() == []
        finally:
            await app.stop(second)
        third = await start(TENANTS)
        try:
            async with AsyncClient(third.address, default_token) as default:
                assert await refused(default.list_sessions()) == "bearer token revoked"
        finally:
            await app.stop(third)
        fourth = await start([])  # no tenant declared again: a new default token, the old one stays dead
        try:
            renewed = fourth.settings.token_file.read_text().strip()
            assert renewed != default_token
            async with AsyncClient(fourth.address, renewed) as default:
                assert await default.list_sessions() == []
            async with AsyncClient(fourth.address, default_token) as old:
                assert await refused(old.list_sessions()) == "unknown bearer token"
        finally:
            await app.stop(fourth)
    finally:
        remove_data_dir(data_dir)


async def test_an_open_subscription_ends_at_its_next_event_once_its_token_is_revoked(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        made = await admin.create_tenant("bob")
        async with AsyncClient(plane.plane.address, made.token) as bob:
            events = bob.subscribe_events()
            await events.initial_metadata()
            await bob.create_session()
            assert (await anext(aiter(events))).type == "session.created"
            await admin.delete_tenant("bob")  # revoked first, then its session's deletion is the next event
            assert await refused(anext(aiter(events))) == "bearer token revoked"


def _admin_methods() -> list[str]:
    return [f"/{ADMIN_SERVICE.full_name}/{m.name}" for m in ADMIN_SERVICE.methods]


async def test_every_admin_method_refuses_anything_but_the_admin_token(plane: Plane) -> None:
    assert len(_admin_methods()) == 7
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        for path in _admin_methods():
            unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            for metadata, why in (
                ((), "missing `authorization: Bearer <token>` metadata"),
                ((("authorization", "Bearer token-alpha"),), "unknown admin token"),
                ((("authorization", "Bearer wrong"),), "unknown admin token"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await unary(b"", metadata=metadata, timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, path
                assert info.value.details() == why
    async with admin_of(plane) as admin:
        assert [t.name for t in await admin.list_tenants()] == ["alpha"]  # nothing was made
