"""The warm pool hands a sandbox over or removes it: none is lost between the two."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from controlplane.core.seam.provider import Sandbox, SandboxAgent
from controlplane.sandbox.pool import WarmPool


async def test_a_take_cancelled_during_the_health_check_discards_the_sandbox() -> None:
    made = iter(range(100))
    discarded: list[str] = []
    checking = asyncio.Event()

    async def create() -> Sandbox:
        return Sandbox(f"sbx{next(made)}", cast(SandboxAgent, cast(Any, None)))

    async def discard(sandbox_id: str) -> None:
        discarded.append(sandbox_id)

    async def slow_check(_: Sandbox) -> bool:
        checking.set()
        await asyncio.sleep(10)  # an agent that takes its time to answer
        return True

    pool = WarmPool(1, 1, create, discard, slow_check)
    pool.start()
    for _ in range(100):
        if pool.ids():
            break
        await asyncio.sleep(0.01)
    pooled = pool.ids()
    assert len(pooled) == 1
    taking = asyncio.ensure_future(pool.take())
    await checking.wait()
    taking.cancel()  # the session's creation was given up
    with pytest.raises(asyncio.CancelledError):
        await taking
    assert discarded == list(pooled)  # out of the pool, handed to nobody: removed
    await pool.close()
