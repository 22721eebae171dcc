"""The warm pool under one tenant's burst (sandbox/pool_share.py): tenant B's CreateSession latency alone, then
while tenant A creates and deletes in three loops, on one Docker plane with a pool of POOL_SIZE. The fairness
bench keeps its pool empty (every create cold, like with like); this one measures what the pool gives B.

Run: `.venv/bin/python -m tests.bench.pool_share_bench` (add `--no-share` for the pool without shares, as
before). Bounded: B makes SAMPLES creates, one every GAP_S; A's loops stop with them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from controlplane.client import AsyncClient
from controlplane.sandbox.pool_share import PoolShare
from tests.planes import Plane, running_plane

POOL_SIZE = 4
FLOOD_LOOPS = 3
SAMPLES = 10
GAP_S = 2.0
TENANTS = [{"name": "a", "token": "bench-a"}, {"name": "b", "token": "bench-b"}]


async def pool_full(plane: Plane) -> None:
    provider = plane.plane.sessions._provider  # the bench looks at the pool it measures
    for _ in range(600):
        if provider.pool_stats().ready >= POOL_SIZE:
            return
        await asyncio.sleep(0.2)


async def timed_create(client: AsyncClient) -> float:
    started = time.perf_counter()
    session = await client.create_session()
    took = (time.perf_counter() - started) * 1000
    await client.delete_session(session.id)
    return took


async def measure() -> tuple[list[float], list[float]]:
    async with running_plane("docker", pool={"size": POOL_SIZE, "refill_concurrency": 2}, tenants=TENANTS) as plane:
        a, b = AsyncClient(plane.plane.address, "bench-a"), AsyncClient(plane.plane.address, "bench-b")
        alone = []
        for _ in range(SAMPLES // 2):
            await pool_full(plane)
            alone.append(await timed_create(b))
        await pool_full(plane)
        stop = asyncio.Event()

        async def flood() -> None:
            while not stop.is_set():
                await timed_create(a)

        floods = [asyncio.get_running_loop().create_task(flood()) for _ in range(FLOOD_LOOPS)]
        await asyncio.sleep(1.0)
        during = []
        for _ in range(SAMPLES):
            during.append(await timed_create(b))
            await asyncio.sleep(GAP_S)
        stop.set()
        await asyncio.gather(*floods, return_exceptions=True)
        await a.close()
        await b.close()
        return alone, during


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-share", action="store_true", help="every tenant takes from the pool as it likes")
    if parser.parse_args().no_share:
        PoolShare.may_take = lambda self, tenant, ready, size: True  # type: ignore[method-assign]
    alone, during = asyncio.run(measure())
    cold = sum(ms > 1000 for ms in during)
    print(f"B create alone: p50 {statistics.median(alone):.0f} ms; during A's burst: p50 "
          f"{statistics.median(during):.0f} ms, max {max(during):.0f} ms, {cold} of {len(during)} over 1 s "
          f"(cold); samples {[round(ms) for ms in during]}")


if __name__ == "__main__":
    main()
