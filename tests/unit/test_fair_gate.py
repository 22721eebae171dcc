"""The fair gate for creates (controlplane/core/sessions/fair_gate.py): at most `width` inside, tenants let in
in turn, so another tenant's create waits for at most one of a burst's; a waiter that gives up frees nothing
it did not hold and loses no slot."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.sessions.fair_gate import FairGate


async def test_tenants_take_turns_however_many_one_of_them_queued() -> None:
    gate = FairGate(1)
    order: list[str] = []
    release = asyncio.Event()

    async def create(tenant: str, name: str) -> None:
        async with gate.slot(tenant):
            order.append(name)
            await release.wait()

    first = asyncio.ensure_future(create("a", "a0"))
    await asyncio.sleep(0)
    burst = [asyncio.ensure_future(create("a", f"a{i}")) for i in range(1, 4)]
    await asyncio.sleep(0)
    other = asyncio.ensure_future(create("b", "b1"))
    await asyncio.sleep(0)
    assert (gate.busy, gate.waiting()) == (1, 4)
    release.set()
    await asyncio.gather(first, *burst, other)
    assert order == ["a0", "a1", "b1", "a2", "a3"]
    assert (gate.busy, gate.waiting()) == (0, 0)


async def test_at_most_width_are_inside() -> None:
    gate = FairGate(2)
    inside = most = 0

    async def create(tenant: str) -> None:
        nonlocal inside, most
        async with gate.slot(tenant):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(create(t) for t in "aaaabbc"))
    assert most == 2
    assert gate.busy == 0


async def test_a_waiter_that_gives_up_loses_no_slot() -> None:
    gate = FairGate(1)
    hold = asyncio.Event()

    async def holder() -> None:
        async with gate.slot("a"):
            await hold.wait()

    async def waiter(tenant: str) -> str:
        async with gate.slot(tenant):
            return tenant

    held = asyncio.ensure_future(holder())
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(waiter("b"))
    stays = asyncio.ensure_future(waiter("c"))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    hold.set()
    assert await stays == "c"
    await held
    assert (gate.busy, gate.waiting()) == (0, 0)
    with pytest.raises(ValueError, match="width of at least 1"):
        FairGate(0)
