"""The per-tenant turn that every count-then-store of a tenant's kept workspaces holds (tenant_turns.py)."""

from __future__ import annotations

import asyncio

from controlplane.core.sessions.tenant_turns import TenantTurns


async def test_one_holder_at_a_time_per_tenant_and_tenants_apart() -> None:
    turns = TenantTurns()
    inside: list[str] = []
    most = 0

    async def hold(tenant: str) -> None:
        nonlocal most
        async with turns.turn(tenant):
            inside.append(tenant)
            most = max(most, inside.count(tenant))
            await asyncio.sleep(0.01)
            inside.remove(tenant)

    await asyncio.gather(*(hold("a") for _ in range(5)), *(hold("b") for _ in range(5)))
    assert most == 1
    # Tenants do not wait for each other: b's turn is free while a's is held.
    async with turns.turn("a"):
        await asyncio.wait_for(hold("b"), 1)
    assert not turns._turns  # nothing kept once no one holds or waits


async def test_a_task_started_under_the_turn_shares_it() -> None:
    # A session ending under a pause's turn keeps its workspace in a task of its own: it must not wait for the turn
    # its starter holds (it would never get it), but a stranger's task must.
    turns = TenantTurns()

    async def keep() -> str:
        async with turns.turn("a"):
            return "kept"

    async with turns.turn("a"):
        assert await asyncio.wait_for(asyncio.ensure_future(keep()), 1) == "kept"
    outside = asyncio.Event()

    async def holder() -> None:
        async with turns.turn("a"):
            outside.set()
            await asyncio.sleep(0.2)

    held = asyncio.ensure_future(holder())
    await outside.wait()
    waiting = asyncio.ensure_future(keep())  # started outside the holder: waits
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await held
    assert await waiting == "kept"
