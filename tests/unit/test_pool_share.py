"""A warm pool shared by tenants: one tenant's burst leaves the others their share (sandbox/pool_share.py)."""

from __future__ import annotations

import asyncio

from controlplane.core.seam.provider import Sandbox
from controlplane.sandbox.pool import WarmPool
from controlplane.sandbox.pool_share import PoolShare


def test_a_tenant_alone_on_the_pool_takes_all_of_it() -> None:
    share = PoolShare()
    for ready in range(4, 0, -1):
        assert share.may_take("a", ready, 4)
        share.took("a")


def test_a_bursting_tenant_leaves_the_others_their_share() -> None:
    now = [0.0]
    share = PoolShare(recent_s=60.0, clock=lambda: now[0])
    for _ in range(10):
        share.took("a")
    share.took("b")
    assert share.may_take("a", 3, 4)  # more than b's half is ready
    assert not share.may_take("a", 2, 4)  # b's half is kept for b (a took more than its share)
    assert share.may_take("b", 1, 4)  # b has had less than its share of the takes: even the last one
    share.took("c")
    assert not share.may_take("a", 3, 6)  # two others: two thirds of a pool of 6 kept
    assert share.may_take("a", 5, 6)
    now[0] += 61.0  # b and c have not created for a minute: a has the pool again
    share.took("a")
    assert share.may_take("a", 1, 4)


async def test_the_pool_answers_none_to_a_tenant_past_its_share() -> None:
    made = 0
    refill = asyncio.Event()  # after the first four, refills wait: what is ready stays as the test says

    async def create() -> Sandbox:
        nonlocal made
        made += 1
        if made > 4:
            await refill.wait()
        return Sandbox(f"sb{made}", None)  # type: ignore[arg-type]

    async def discard(_: str) -> None:
        return None

    async def check(_: Sandbox) -> bool:
        return True

    pool = WarmPool(4, 4, create, discard, check)
    pool.start()
    for _ in range(500):
        if pool.stats().ready == 4:
            break
        await asyncio.sleep(0.01)
    assert await pool.take("b") is not None
    assert await pool.take("a") is not None  # 3 ready: more than b's half
    assert await pool.take("a") is not None  # b's half, but a has had no more than b
    assert await pool.take("a") is None  # a has had more than its share: the last one is kept for b
    assert pool.stats().ready == 1
    assert await pool.take("b") is not None
    assert await pool.take() is None  # empty
    refill.set()
    await pool.close()
