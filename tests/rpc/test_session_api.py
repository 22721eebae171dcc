"""The public API over real gRPC, with in-process agents (fast, no Docker)."""

from __future__ import annotations

import asyncio
import os
import stat

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.app import DEFAULT_TOKEN_PREFIX
from controlplane.client import AsyncClient
from controlplane.v1 import sandbox_pb2, session_pb2, session_pb2_grpc
from tests.planes import Plane, running_plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]


two_tenants = served_plane("local", name="two_tenants", tenants=TENANTS)


async def test_requests_without_a_valid_token_are_unauthenticated(two_tenants: Plane) -> None:
    channel = grpc.aio.insecure_channel(two_tenants.plane.address)
    stub = session_pb2_grpc.SessionServiceStub(channel)
    for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", "Basic token-alpha"),)]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ListSessions(session_pb2.ListSessionsRequest(), metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    await channel.close()


async def test_another_tenants_session_is_not_found(two_tenants: Plane) -> None:
    alpha = two_tenants.client
    session = await alpha.create_session(labels={"team": "a"})
    async with AsyncClient(two_tenants.plane.address, "token-beta") as beta:
        for call in (beta.get_session(session.id), beta.delete_session(session.id), beta.run(session.id, ["true"])):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert [s.id for s in await beta.list_sessions()] == []
    assert (await alpha.get_session(session.id)).state == session_pb2.Session.READY


async def test_session_lifecycle_and_exec(two_tenants: Plane) -> None:
    client = two_tenants.client
    session = await client.create_session(agent="plan", labels={"k": "v"})
    assert (session.agent, dict(session.labels), session.tenant) == ("plan", {"k": "v"}, "alpha")
    assert session.expires_at.seconds > session.created_at.seconds
    done = await client.run(session.id, command="echo $PWD; echo oops >&2; exit 4")
    assert (done.exit_code, done.stderr) == (4, b"oops\n")
    assert done.stdout.decode().strip().endswith("workspace")
    assert session.id in [s.id for s in await client.list_sessions()]
    await client.delete_session(session.id)
    assert session.id not in [s.id for s in await client.list_sessions()]
    assert session.id in [s.id for s in await client.list_sessions(include_deleted=True)]


@pytest.mark.parametrize(
    ("start", "code", "text"),
    [
        (sandbox_pb2.ExecStart(session_id="ses_nope", argv=["true"]), grpc.StatusCode.NOT_FOUND, "not found"),
        (sandbox_pb2.ExecStart(argv=["true"], command="true"), grpc.StatusCode.INVALID_ARGUMENT, "exactly one"),
        (sandbox_pb2.ExecStart(), grpc.StatusCode.INVALID_ARGUMENT, "exactly one"),
        (sandbox_pb2.ExecStart(argv=["a\0b"]), grpc.StatusCode.INVALID_ARGUMENT, "NUL"),
        (sandbox_pb2.ExecStart(argv=["/no/such/binary"]), grpc.StatusCode.FAILED_PRECONDITION, "no such file"),
    ],
)
async def test_bad_exec_requests_get_clear_errors(
    two_tenants: Plane, start: sandbox_pb2.ExecStart, code: grpc.StatusCode, text: str
) -> None:
    if not start.session_id:
        start.session_id = (await two_tenants.client.create_session()).id
    call = two_tenants.client.sandbox.Exec(
        iter([sandbox_pb2.ExecRequest(start=start)]), metadata=(("authorization", "Bearer token-alpha"),)
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == code
    assert text in (info.value.details() or "")


async def test_bad_create_requests_change_nothing(two_tenants: Plane) -> None:
    before = len(await two_tenants.client.list_sessions(include_deleted=True))
    for kwargs, code in [
        ({"config_json": "{not json"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"config_json": "[1, 2]"}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"pids": 1}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"cpu": 1000.0}, grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await two_tenants.client.create_session(**kwargs)  # type: ignore[arg-type]
        assert info.value.code() == code
    assert len(await two_tenants.client.list_sessions(include_deleted=True)) == before


async def test_default_tenant_token_file_is_private() -> None:
    async with running_plane("local") as plane:
        token_file = plane.plane.settings.token_file
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        assert (await plane.client.list_sessions()) == []
        # Never a leading "-": `controlplane ... --token TOKEN` would take it for an option.
        assert token_file.read_text().startswith(DEFAULT_TOKEN_PREFIX)
        assert not DEFAULT_TOKEN_PREFIX.startswith("-")


async def test_idle_sessions_expire() -> None:
    async with running_plane("local", lifetime={"idle_timeout_s": 0.3, "reap_interval_s": 0.1}) as plane:
        session = await plane.client.create_session()
        for _ in range(50):
            current = await plane.client.get_session(session.id)
            if current.state == session_pb2.Session.DELETED:
                break
            await asyncio.sleep(0.05)
        assert current.state == session_pb2.Session.DELETED
        assert "idle" in current.status_message


async def test_continuous_activity_reaches_the_store_about_once_a_second() -> None:
    """Activity is batched in memory, but a session busy every 0.4 s must still show it in the store."""
    async with running_plane("local") as plane:
        session = await plane.client.create_session()
        manager = plane.plane.sessions
        now = [1_000_000.0]
        manager._clock = lambda: now[0]
        for _ in range(8):
            now[0] += 0.4
            assert (await plane.client.run(session.id, ["true"])).exit_code == 0
        await asyncio.sleep(0.1)  # the writes run in the background
        stored = await manager._store.get_session(session.id)
        assert stored is not None
        assert stored.last_active_at >= now[0] - 1.0, (stored.last_active_at, now[0])
