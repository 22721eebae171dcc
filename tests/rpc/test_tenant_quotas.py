"""Per-tenant quotas through the public API: each refused with RESOURCE_EXHAUSTED naming the quota, the
use and the limit; layered global -> tenant entry -> SetQuota; GetUsage counting what is held."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient, quota
from controlplane.client import AsyncClient
from tests.planes import Plane, served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "alpha", "token": "token-alpha", "quota": {"sessions": 2, "cpu": 1.5, "memory_mb": 768, "calls": 1,
                                                         "subscriptions": 1}},
    {"name": "beta", "token": "token-beta", "quota": {"sessions": -1}},
    {"name": "gamma", "token": "token-gamma"},
]
GLOBAL = {"sessions": 1, "disk_mb": 3000}


plane = served_plane("local", scope="function", tenants=TENANTS, quota=GLOBAL, pool={"size": 0},
                     resources={"cpu": 0.5, "memory_mb": 256, "disk_mb": 1024})


@pytest.fixture
async def admin(plane: Plane) -> AsyncIterator[AsyncAdminClient]:
    token = plane.plane.settings.admin_token_file.read_text().strip()
    async with AsyncAdminClient(plane.plane.address, token) as client:
        yield client


clients = tenant_clients(TENANTS)


async def exhausted(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    return info.value.details() or ""


async def test_the_session_quota_names_the_use_and_the_limit(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    await alpha.create_session()
    await alpha.create_session()
    assert await exhausted(alpha.create_session()) == (
        "tenant alpha's quota of 2 sessions is used up (2 live); delete a session or ask the operator to raise it"
    )
    assert len(await alpha.list_sessions()) == 2  # the refused create left nothing


async def test_cpu_and_memory_quotas_count_what_live_sessions_reserve(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    first = await alpha.create_session(cpu=1.0)
    assert await exhausted(alpha.create_session(cpu=1.0)) == (
        "tenant alpha's quota of 1.5 CPUs would be exceeded: 1 reserved by live sessions and 1 asked; "
        "delete a session or ask the operator to raise it"
    )
    await alpha.delete_session(first.id)
    await alpha.create_session(memory_mb=512)
    assert await exhausted(alpha.create_session(memory_mb=512)) == (
        "tenant alpha's quota of 768 MiB of memory would be exceeded: 512 reserved by live sessions and 512 asked; "
        "delete a session or ask the operator to raise it"
    )


async def test_the_global_quota_is_the_default_and_a_tenant_may_lift_it(clients: dict[str, AsyncClient]) -> None:
    gamma, beta = clients["gamma"], clients["beta"]
    await gamma.create_session()
    assert "tenant gamma's quota of 1 sessions is used up (1 live)" in await exhausted(gamma.create_session())
    await beta.create_session()
    await beta.create_session()  # beta's -1 lifts the global session limit; the disk default still holds
    assert await exhausted(beta.create_session()) == (
        "tenant beta's quota of 3000 MiB of workspace disk would be exceeded: 2048 reserved by live sessions and "
        "1024 asked; delete a session or ask the operator to raise it"
    )


async def test_concurrent_creates_cannot_both_take_the_last_slot(clients: dict[str, AsyncClient]) -> None:
    gamma = clients["gamma"]
    results = await asyncio.gather(*(gamma.create_session() for _ in range(4)), return_exceptions=True)
    made = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(made) == 1
    assert len(refused) == 3
    assert all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in refused)


async def test_the_calls_quota_bounds_concurrent_execs_and_tool_calls(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    long = alpha.exec_call(session.id, ["sleep", "30"])
    first = await anext(aiter(long))
    assert first.WhichOneof("event") == "started_pid"
    message = (
        "tenant alpha's quota of 1 concurrent calls is used up (1 running); "
        "wait for a call to end or ask the operator to raise it"
    )
    assert await exhausted(alpha.run(session.id, ["true"])) == message
    assert await exhausted(alpha.execute_tool(session.id, "read", {"filePath": "x"})) == message
    long.cancel()
    for _ in range(100):  # the slot is released when the server's handler ends, just after the cancel
        try:
            done = await alpha.run(session.id, ["echo", "ok"])
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        else:
            assert done.stdout == b"ok\n"
            break
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the calls slot was never released")


async def test_the_subscriptions_quota(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    first = alpha.subscribe_events()
    await first.initial_metadata()  # subscribed
    second = alpha.subscribe_events()
    assert await exhausted(anext(aiter(second))) == (
        "tenant alpha's quota of 1 event subscriptions is used up (1 open); "
        "close a subscription or ask the operator to raise it"
    )
    first.cancel()
    for _ in range(100):
        third = alpha.subscribe_events()
        try:
            await third.initial_metadata()
            if await asyncio.wait_for(third.code(), 0.2) == grpc.StatusCode.RESOURCE_EXHAUSTED:
                await asyncio.sleep(0.05)
                continue
        except TimeoutError:
            third.cancel()  # still open after 0.2 s: it was admitted
            break
    else:
        raise AssertionError("the subscription slot was never released")


async def test_set_quota_takes_effect_at_once_and_usage_reports_it(
    clients: dict[str, AsyncClient], admin: AsyncAdminClient,
) -> None:
    gamma = clients["gamma"]
    await gamma.create_session()
    await exhausted(gamma.create_session())
    updated = await admin.set_quota("gamma", quota(sessions=3, calls=5))
    assert (updated.quota.sessions, updated.quota.calls, updated.quota.disk_mb) == (3, 5, 3000)
    assert not updated.quota.HasField("cpu")
    await gamma.create_session(cpu=1.0, memory_mb=300)
    usage = await admin.usage("gamma")
    assert (usage.tenant, usage.sessions, usage.cpu, usage.memory_mb, usage.disk_mb) == ("gamma", 2, 1.5, 556, 2048)
    assert (usage.calls, usage.subscriptions, usage.cpu_seconds) == (0, 0, 0.0)
    assert usage.quota.sessions == 3
    listed = {t.name: t.quota for t in await admin.list_tenants()}
    assert listed["gamma"].sessions == 3
    assert listed["alpha"].sessions == 2
    lifted = await admin.set_quota("gamma", quota(sessions=-1, disk_mb=-1))
    assert not lifted.quota.HasField("sessions")
    assert not lifted.quota.HasField("disk_mb")
    await gamma.create_session()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await admin.set_quota("gamma", quota(sessions=-5))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_usage_counts_running_calls(clients: dict[str, AsyncClient], admin: AsyncAdminClient) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    long = alpha.exec_call(session.id, ["sleep", "30"])
    await anext(aiter(long))
    usage = await admin.usage("alpha")
    assert (usage.calls, usage.calls_started) == (1, 1)
    long.cancel()
