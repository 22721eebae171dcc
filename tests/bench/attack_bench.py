"""The agent and a neighbour session under attack (fork bomb, memory bomb, CPU hog, disk fill): health and
abort latency of the attacked session's agent, and a neighbour's tool-call latency against its idle baseline.

Run alone: `.venv/bin/python -m tests.bench.attack_bench [--quick]` (needs the Docker engine and the image).
Targets (sandbox-anchors G10): agent health p99 ≤ 200 ms and abort ≤ 200 ms while attacked; the neighbour's
p99 within 3x its idle p99 (and ≤ 200 ms).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass

from controlplane.client import AsyncClient, Session
from tests.planes import Plane, running_plane
from tests.security.test_resources import HOLDING_BOMB, RunningCall, agent_health_latency

ATTACKS = {
    "fork bomb": HOLDING_BOMB,
    "memory bomb": "while :; do python3 -c \"s = b'x' * (2 << 30)\" 2>/dev/null; done",
    "cpu hog": "for i in 1 2 3 4; do (while :; do :; done) & done; wait",
    "disk fill": "while :; do fallocate -l 3G /workspace/f; rm -f /workspace/f; head -c 300M /dev/zero > /tmp/f"
                 " 2>/dev/null; rm -f /tmp/f; done",
}
TARGET_MS = 200.0
NEIGHBOUR_RATIO = 3.0
WARMUP_S = 1.0


@dataclass
class Measured:
    attack: str
    health_ms: list[float]
    neighbour_ms: list[float]
    abort_ms: list[float]


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def neighbour_call_ms(client: AsyncClient, session_id: str) -> float:
    started = time.monotonic()
    out = await client.execute_tool(session_id, "bash", {"command": "echo ok", "description": "Neighbour"})
    assert out.output == "ok\n", out.output
    return (time.monotonic() - started) * 1000


async def idle_baseline(plane: Plane, neighbour: Session, samples: int) -> list[float]:
    await neighbour_call_ms(plane.client, neighbour.id)  # the first call starts the session's helpers
    return [await neighbour_call_ms(plane.client, neighbour.id) for _ in range(samples)]


async def under_attack(plane: Plane, victim: Session, neighbour: Session, attack: str, samples: int,
                       aborts: int) -> Measured:
    """Runs `attack` in `victim` `aborts` times; samples health and neighbour calls while each runs."""
    measured = Measured(attack, [], [], [])
    per_round = max(1, samples // aborts)
    for _ in range(aborts):
        call = RunningCall(plane.client, victim.id, ATTACKS[attack])
        await asyncio.sleep(WARMUP_S)
        for _ in range(per_round):
            measured.health_ms.append(await agent_health_latency(plane, victim.sandbox_id) * 1000)
            measured.neighbour_ms.append(await neighbour_call_ms(plane.client, neighbour.id))
        started = time.monotonic()
        event = await call.abort()
        measured.abort_ms.append((time.monotonic() - started) * 1000)
        assert event.WhichOneof("event") == "result", event
    # What an aborted attack left behind (a disk fill stopped between its write and its rm).
    await plane.client.run(victim.id, command="rm -f /workspace/f /tmp/f")
    return measured


def report(measured: Measured, idle: list[float]) -> list[str]:
    health99, abort_max = p(measured.health_ms, 0.99), max(measured.abort_ms)
    near99, idle99 = p(measured.neighbour_ms, 0.99), p(idle, 0.99)
    ratio = near99 / idle99 if idle99 else float("inf")

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    return [
        f"  {measured.attack:12s} agent health p50 {statistics.median(measured.health_ms):6.1f} ms, p99 "
        f"{health99:6.1f} ms (n={len(measured.health_ms)}; target p99 ≤ {TARGET_MS:.0f} ms) "
        f"{verdict(health99 <= TARGET_MS)}",
        f"  {'':12s} abort max {abort_max:6.1f} ms (n={len(measured.abort_ms)}; target ≤ {TARGET_MS:.0f} ms) "
        f"{verdict(abort_max <= TARGET_MS)}",
        f"  {'':12s} neighbour call p50 {statistics.median(measured.neighbour_ms):6.1f} ms, p99 {near99:6.1f} ms, "
        f"idle p99 {idle99:6.1f} ms, ratio {ratio:4.2f}x (target ≤ {NEIGHBOUR_RATIO:.0f}x and ≤ {TARGET_MS:.0f} ms) "
        f"{verdict(ratio <= NEIGHBOUR_RATIO and near99 <= TARGET_MS)}",
    ]


async def section(quick: bool) -> list[str]:
    samples, aborts = (20, 2) if quick else (200, 10)
    lines = [f"Under attack ({samples} health/neighbour samples and {aborts} aborts per attack):"]
    async with running_plane("docker", pool={"size": 0}) as plane:
        victim = await plane.client.create_session(memory_mb=256)
        neighbour = await plane.client.create_session()
        idle = await idle_baseline(plane, neighbour, samples)
        for attack in ATTACKS:
            lines += report(await under_attack(plane, victim, neighbour, attack, samples, aborts), idle)
    return lines


if __name__ == "__main__":
    for line in asyncio.run(section("--quick" in sys.argv)):
        print(line)
