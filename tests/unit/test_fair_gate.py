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


async def test_another_tenant_enters_at_once_while_one_tenant_fills_its_share() -> None:
    gate = FairGate(3, per_tenant=2)
    release = asyncio.Event()
    entered: list[str] = []

    async def create(tenant: str, name: str) -> None:
        async with gate.slot(tenant):
            entered.append(name)
            await release.wait()

    burst = [asyncio.ensure_future(create("a", f"a{i}")) for i in range(5)]
    await asyncio.sleep(0)
    assert (gate.busy, gate.held("a"), gate.waiting()) == (2, 2, 3)
    other = asyncio.ensure_future(create("b", "b0"))
    await asyncio.sleep(0)
    assert entered == ["a0", "a1", "b0"]  # b did not wait for any of a's to end
    assert (gate.busy, gate.held("b")) == (3, 1)
    release.set()
    await asyncio.gather(*burst, other)
    assert (gate.busy, gate.waiting(), gate.held("a")) == (0, 0, 0)


async def test_a_tenant_never_holds_more_than_its_share_and_the_rest_waits_for_its_own() -> None:
    gate = FairGate(3, per_tenant=2)
    inside: dict[str, int] = {"a": 0, "b": 0}
    most: dict[str, int] = {"a": 0, "b": 0}

    async def create(tenant: str) -> None:
        async with gate.slot(tenant):
            inside[tenant] += 1
            most[tenant] = max(most[tenant], inside[tenant])
            await asyncio.sleep(0.005)
            inside[tenant] -= 1

    await asyncio.gather(*(create(t) for t in "aaaaaaabb"))
    assert most["a"] == 2  # never the third slot, though it queued more than the gate holds
    assert most["b"] == 1
    assert (gate.busy, gate.waiting()) == (0, 0)


async def test_a_share_that_does_not_fit_the_width_is_refused() -> None:
    with pytest.raises(ValueError, match="between 1 and its width 2"):
        FairGate(2, per_tenant=3)
    gate = FairGate.for_creates()
    assert gate.busy == 0


async def test_while_another_tenant_creates_a_burst_gives_back_slots_as_its_creates_end() -> None:
    gate = FairGate(3, per_tenant=2)
    ends = {name: asyncio.Event() for name in ("a0", "a1", "a2", "a3", "b0")}
    entered: list[str] = []

    async def create(tenant: str, name: str) -> None:
        async with gate.slot(tenant):
            entered.append(name)
            await ends[name].wait()

    burst = [asyncio.ensure_future(create("a", f"a{i}")) for i in range(4)]
    await asyncio.sleep(0)
    other = asyncio.ensure_future(create("b", "b0"))
    await asyncio.sleep(0)
    ends["a0"].set()
    await asyncio.sleep(0.01)
    assert entered == ["a0", "a1", "b0"]  # a2 waits: while b creates, a's share is one slot
    assert (gate.busy, gate.held("a"), gate.held("b")) == (2, 1, 1)
    ends["b0"].set()
    await asyncio.sleep(0.01)
    assert entered == ["a0", "a1", "b0", "a2"]  # b done: a has its whole share again
    assert gate.held("a") == 2
    for end in ends.values():
        end.set()
    await asyncio.gather(*burst, other)
    assert (gate.busy, gate.waiting()) == (0, 0)


async def test_a_holder_is_pressed_only_by_another_tenant_that_a_freed_slot_would_let_in() -> None:
    """What a workspace copy whose sandbox stalls gives its slot up for (workspace_spool.fill)."""
    gate = FairGate(2, 1)
    release = asyncio.Event()

    async def hold(tenant: str) -> None:
        async with gate.slot(tenant):
            await release.wait()

    holders = [asyncio.ensure_future(hold(t)) for t in "ac"]
    await asyncio.sleep(0)
    watch = asyncio.ensure_future(gate.until_pressed("a"))
    own = asyncio.ensure_future(hold("a"))  # a's own second copy waits: a freed slot of a's is a's again
    await asyncio.sleep(0.01)
    assert (gate.pressed("a"), gate.pressed("c"), watch.done()) == (False, False, False)
    other = asyncio.ensure_future(hold("b"))  # b holds nothing: a slot freed by a or c would be b's
    await asyncio.sleep(0.01)
    assert (gate.pressed("a"), gate.pressed("c"), gate.pressed("b"), watch.done()) == (True, True, False, True)
    release.set()
    await asyncio.gather(*holders, own, other)
    assert not gate.pressed("a")
