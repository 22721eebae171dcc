"""The budget of large tool-call arguments in running calls (controlplane/core/calls/argument_budget.py): a
call past its tenant's or the global budget waits for room, a tenant's waiting calls are bounded (past that
RESOURCE_EXHAUSTED with the figures), one tenant's queue does not hold back another's calls, small arguments
are not counted, and what a call holds comes back however it ends."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.calls.argument_budget import ArgumentBudget, Hold
from controlplane.errors import ResourceExhaustedError

K = 100_000  # above arguments.OFF_LOOP_BYTES: counted


async def taken(budget: ArgumentBudget, tenant: str, n: int) -> Hold:
    hold = await budget.take(tenant, n)
    assert hold is not None
    return hold


async def test_past_its_running_budget_a_tenants_call_waits_and_past_its_queue_it_is_refused() -> None:
    budget = ArgumentBudget(tenant_bytes=3 * K, queued_bytes=3 * K, total_bytes=0)
    first = await taken(budget, "a", 2 * K)
    second = asyncio.ensure_future(taken(budget, "a", 2 * K))
    third = asyncio.ensure_future(taken(budget, "a", K))
    await asyncio.sleep(0.01)
    assert not second.done()
    assert not third.done()
    assert budget.queued("a") == 3 * K
    with pytest.raises(ResourceExhaustedError) as refused:
        await budget.take("a", K)
    assert str(refused.value) == (
        f"tenant 'a' has {2 * K} bytes of large tool-call arguments in running calls (limit {3 * K}, "
        f"limits.max_args_in_flight_mb) and {3 * K} bytes waiting; this call's {K} bytes would pass the limit "
        f"of {3 * K} bytes waiting (limits.max_args_queued_mb): wait for a call to finish"
    )
    other = await taken(budget, "b", 3 * K)  # another tenant: its own budget, not behind a's queue
    first.release()
    first.release()  # twice: given back once
    held = [await second, await third]
    assert budget.running("a") == 3 * K
    assert budget.queued("a") == 0
    for hold in (*held, other):
        hold.release()
    assert budget.total == 0


async def test_small_arguments_are_not_counted_and_one_call_alone_always_runs() -> None:
    budget = ArgumentBudget(tenant_bytes=3 * K, queued_bytes=3 * K, total_bytes=3 * K)
    assert await budget.take("a", 1000) is None
    alone = await asyncio.wait_for(taken(budget, "a", 5 * K), 1)  # larger than all: max_args_bytes bounds it
    assert budget.total == 5 * K
    alone.release()


async def test_past_the_global_budget_the_tenant_with_least_running_goes_first() -> None:
    budget = ArgumentBudget(tenant_bytes=0, queued_bytes=0, total_bytes=4 * K)
    a1 = await taken(budget, "a", 2 * K)
    a2 = await taken(budget, "a", 2 * K)
    order: list[str] = []

    async def take(tenant: str, n: int) -> Hold:
        hold = await taken(budget, tenant, n)
        order.append(tenant)
        return hold

    a_queue = [asyncio.ensure_future(take("a", 2 * K)) for _ in range(3)]
    await asyncio.sleep(0.01)
    b = asyncio.ensure_future(take("b", 2 * K))  # after a's three, but b runs nothing
    c = asyncio.ensure_future(take("c", 2 * K))
    await asyncio.sleep(0.01)
    assert order == []
    c.cancel()  # a cancelled waiter gives its place
    await asyncio.sleep(0)
    assert budget.queued("c") == 0
    a1.release()
    await asyncio.sleep(0.01)
    assert order == ["b"]  # not a's next: a runs 2K, b none
    a2.release()
    await asyncio.sleep(0.01)
    assert order == ["b", "a"]
    (await b).release()
    for call in a_queue:
        (await call).release()
    assert order == ["b", "a", "a", "a"]
    assert budget.total == 0
