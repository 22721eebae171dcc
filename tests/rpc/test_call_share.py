"""The fair share of calls among tenants through the public API (controlplane/core/tenants/call_share.py, asked by
the auth interceptor before it accepts a request stream): a lone tenant runs its whole `calls` quota; while another
tenant calls, a busy tenant's call beyond its share waits its turn (it is not refused) and runs once one of its
calls ends; a waiting call the client cancels gives its quota slot back at once."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from controlplane.client import AsyncClient
from controlplane.core.tenants.call_share import CallShare
from controlplane.core.tenants.quota import TenantQuotas
from tests.planes import Plane, served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "alpha", "token": "token-alpha", "quota": {"calls": 4}},
    {"name": "beta", "token": "token-beta"},
]

plane = served_plane("local", scope="module", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)


def quotas_of(plane: Plane) -> TenantQuotas:
    assert plane.plane.tenants is not None
    quotas: TenantQuotas = plane.plane.tenants.quotas
    quotas.call_share = CallShare(width=2)  # the same share on any host: one call each while both call
    return quotas


async def started(call: Any) -> None:
    event = await asyncio.wait_for(anext(aiter(call)), 10)
    assert event.WhichOneof("event") == "started_pid"


async def test_a_lone_tenant_runs_its_whole_quota(plane: Plane, clients: dict[str, AsyncClient]) -> None:
    quotas_of(plane)
    alpha = clients["alpha"]
    session = await alpha.create_session()
    calls = [alpha.exec_call(session.id, ["sleep", "30"]) for _ in range(4)]
    try:
        await asyncio.gather(*(started(call) for call in calls))
    finally:
        for call in calls:
            call.cancel()


async def alpha_running_while_beta_calls(alpha: AsyncClient, beta: AsyncClient) -> tuple[Any, Any, Any]:
    """Alpha's session, beta's, and alpha's long call, running while beta has just called (beta is active)."""
    mine, theirs = await alpha.create_session(), await beta.create_session()
    long = alpha.exec_call(mine.id, ["sleep", "30"])
    await started(long)
    assert (await beta.run(theirs.id, ["true"])).exit_code == 0  # beta is calling now
    return mine, theirs, long


async def test_a_busy_tenants_call_waits_while_another_calls_then_runs(
    plane: Plane, clients: dict[str, AsyncClient],
) -> None:
    quotas = quotas_of(plane)
    alpha, beta = clients["alpha"], clients["beta"]
    mine, theirs, long = await alpha_running_while_beta_calls(alpha, beta)
    waiting = asyncio.ensure_future(alpha.run(mine.id, ["echo", "ok"]))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "alpha's second call ran beside its first while beta was calling"
    assert quotas.call_share.waiting("alpha") == 1
    assert quotas.running("alpha").calls == 2  # it holds its quota slot while it waits
    done = await asyncio.wait_for(beta.run(theirs.id, ["echo", "b"]), 10)  # beta's next call starts at once
    assert done.stdout == b"b\n"
    long.cancel()
    assert (await asyncio.wait_for(waiting, 10)).stdout == b"ok\n"  # its turn came when alpha's first ended


async def test_a_waiting_call_cancelled_by_its_client_gives_its_slot_back(
    plane: Plane, clients: dict[str, AsyncClient],
) -> None:
    quotas = quotas_of(plane)
    alpha, beta = clients["alpha"], clients["beta"]
    mine, _, long = await alpha_running_while_beta_calls(alpha, beta)
    waiting = alpha.exec_call(mine.id, ["echo", "never"])
    for _ in range(100):
        if quotas.call_share.waiting("alpha") == 1:
            break
        await asyncio.sleep(0.02)
    assert quotas.call_share.waiting("alpha") == 1
    waiting.cancel()
    for _ in range(100):
        if quotas.call_share.waiting("alpha") == 0 and quotas.running("alpha").calls == 1:
            break
        await asyncio.sleep(0.02)
    assert (quotas.call_share.waiting("alpha"), quotas.running("alpha").calls) == (0, 1)
    assert await waiting.code() == grpc.StatusCode.CANCELLED
    long.cancel()
