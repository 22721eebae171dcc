"""Load on loopback (N sessions x M concurrent tool calls for a bounded time) and create/delete cycles,
inside a leak gate. `make test` runs a small load and ~30 cycles; `make soak` (OCSB_SOAK=1) runs
1,000 cycles and a longer, wider load. Figures are printed (run with -s to see them)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import defaultdict
from typing import Any

import pytest

from controlplane.client import AsyncClient, allow_once
from tests.archives import tar_of
from tests.load.leaks import LeakSnapshot, take
from tests.planes import Plane, served_plane

pytestmark = pytest.mark.docker
SOAK = os.environ.get("OCSB_SOAK") == "1"
SESSIONS, CALLERS, LOAD_S = (8, 4, 30.0) if SOAK else (3, 3, 4.0)
CYCLES = 1000 if SOAK else 30
POOL = 2
WORKSPACE = {"README.md": "# load\nhello world\n", "src/app.py": "def main() -> int:\n    return 0\n"}
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("bash", {"command": "echo hi", "description": "Echo"}),
    ("read", {"filePath": "README.md"}),
    ("glob", {"pattern": "**/*.py"}),
    ("grep", {"pattern": "hello"}),
    ("list", {}),
]
EXPECTED = {"bash": "hi\n", "read": "1: # load", "glob": "/workspace/src/app.py", "grep": "Found 1 matches",
            "list": "/workspace/"}


plane = served_plane("docker", pool={"size": POOL, "refill_concurrency": 2})


async def _settled(plane: Plane) -> None:
    """The warm pool full and idle, so it does not count as a leak or skew a timing."""
    deadline = time.monotonic() + 60
    while True:
        stats = plane.plane.sessions._provider.pool_stats()
        if stats.ready == POOL and stats.creating == 0:
            return
        assert time.monotonic() < deadline, f"the warm pool never settled: {stats}"
        await asyncio.sleep(0.05)


async def _baseline(plane: Plane) -> LeakSnapshot:
    # One warm-up round first: channels, thread pools and the engine client open what they keep open.
    session = await plane.client.create_session(workspace_archive=tar_of(WORKSPACE))
    for tool, args in CALLS:
        await plane.client.execute_tool(session.id, tool, args, on_permission=allow_once)
    await plane.client.delete_session(session.id)
    await _settled(plane)
    await asyncio.sleep(0.3)
    return await _take(plane)


async def _take(plane: Plane) -> LeakSnapshot:
    pooled = {r.id for r in await plane.plane.store.list_sandboxes(plane.instance) if r.state == "pool"}
    return take(plane.instance, plane.plane.settings.data_dir, pooled)


async def _assert_no_leak(plane: Plane, before: LeakSnapshot) -> None:
    await _settled(plane)
    deadline = time.monotonic() + 10
    while diff := before.diff(await _take(plane)):
        # Closed channels and reaped children go away within moments; a leak stays.
        assert time.monotonic() < deadline, f"leaked: {diff}"
        await asyncio.sleep(0.2)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _caller(client: AsyncClient, session_id: str, offset: int, until: float,
                  latencies: dict[str, list[float]], errors: list[str]) -> None:
    n = offset
    while time.monotonic() < until:
        tool, args = CALLS[n % len(CALLS)]
        n += 1
        started = time.perf_counter()
        out = await asyncio.wait_for(client.execute_tool(session_id, tool, args, on_permission=allow_once), 30)
        latencies[tool].append((time.perf_counter() - started) * 1000)
        if out.error is not None or EXPECTED[tool] not in out.output:
            errors.append(f"{tool}: {out.error or out.output[:200]}")


@pytest.mark.timeout(600 if SOAK else 180)
async def test_load_zero_errors_and_no_leaks(plane: Plane) -> None:
    before = await _baseline(plane)
    sessions = [await plane.client.create_session(workspace_archive=tar_of(WORKSPACE)) for _ in range(SESSIONS)]
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    until = time.monotonic() + LOAD_S
    started = time.monotonic()
    await asyncio.gather(*(
        _caller(plane.client, s.id, i * CALLERS + j, until, latencies, errors)
        for i, s in enumerate(sessions) for j in range(CALLERS)
    ))
    elapsed = time.monotonic() - started
    for s in sessions:
        await plane.client.delete_session(s.id)
    total = sum(len(v) for v in latencies.values())
    print(f"\nload: {SESSIONS} sessions x {CALLERS} concurrent callers for {elapsed:.1f} s: {total} calls "
          f"({total / elapsed:.0f}/s), {len(errors)} errors")
    print(f"{'tool':<6} {'calls':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for tool, values in sorted(latencies.items()):
        print(f"{tool:<6} {len(values):>6} {_percentile(values, 0.5):>8.1f} {_percentile(values, 0.95):>8.1f} "
              f"{_percentile(values, 0.99):>8.1f}")
    assert errors == []
    assert set(latencies) == set(EXPECTED)
    await _assert_no_leak(plane, before)


@pytest.mark.timeout(3000 if SOAK else 300)
async def test_create_delete_cycles_leak_nothing_and_do_not_slow_down(plane: Plane) -> None:
    before = await _baseline(plane)
    timings: list[float] = []
    for _ in range(CYCLES):
        started = time.perf_counter()
        session = await plane.client.create_session()
        await plane.client.delete_session(session.id)
        timings.append((time.perf_counter() - started) * 1000)
    tenth = max(1, CYCLES // 10)
    deciles = [statistics.median(timings[i : i + tenth]) for i in range(0, tenth * 10, tenth)]
    print(f"\n{CYCLES} create/delete cycles, median ms per decile: " + " ".join(f"{d:.0f}" for d in deciles))
    # Thirds, not deciles, are compared, by their lower quartile: the engine's own periodic work (and a busy
    # machine) makes runs of cycles of several hundred ms, enough to move a median of ten (a CI run saw deciles
    # of 137 ... 732 ... 622 ms with no leak). A cost that grows with each cycle lifts every cycle, the fast
    # quarter too, so it still shows as a multiple.
    third = max(4, CYCLES // 3)
    first = statistics.quantiles(timings[:third], n=4)[0]
    last = statistics.quantiles(timings[-third:], n=4)[0]
    assert last <= 1.5 * first + 100, f"cycles slowed down: first third {first:.0f} ms, last third {last:.0f} ms"
    await _assert_no_leak(plane, before)
