"""The agent and a neighbour session under attack (fork bomb, memory bomb, CPU hog, disk fill): health and
abort latency of the attacked session's agent, and a neighbour's tool-call latency against its idle baseline.

Run alone: `.venv/bin/python -m tests.bench.attack_bench [--quick] [--only ATTACK] [--aborts N]` (needs the
Docker engine and the image). Targets (sandbox-anchors G10): agent health p99 ≤ 200 ms and abort p99 ≤ 200 ms
while attacked; the neighbour's p99 within 3x its idle p99 (and ≤ 200 ms).

An abort is timed from sending it until both the call's result has arrived and, seen from the host, no live
process of the call is left in the container ("gone": a zombie counts as gone, it runs nothing and holds no
pipe or memory; the call's processes are those not already there before it started).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.client import AsyncClient, Session, allow_once
from sandbox_agent import event_loop
from tests.planes import Plane, running_plane
from tests.security.test_resources import HOLDING_BOMB, RunningCall, agent_health_latency, container_id

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
GONE_POLL_S = 0.002
GONE_BOUND_S = 10.0


@dataclass
class Measured:
    attack: str
    health_ms: list[float]
    neighbour_ms: list[float]
    abort_ms: list[float]
    result_ms: list[float] = field(default_factory=list)
    """Abort to the call's result alone (the agent answers once nothing of the call is alive)."""
    left_at_result: list[int] = field(default_factory=list)
    """Live processes of the call the host still saw when the result arrived (0 expected)."""


def live_pids(cid: str) -> set[int]:
    """The container's processes (not threads) that are not zombies, read on the host (cgroup v1 or v2)."""
    for path in (f"/sys/fs/cgroup/pids/docker/{cid}/cgroup.procs",
                 f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cgroup.procs",
                 *glob.glob(f"/sys/fs/cgroup/pids/ocsb-*/*/{cid}/cgroup.procs")):  # under a tenant's parent
        try:
            pids = Path(path).read_text().split()
        except FileNotFoundError:
            continue
        live = set()
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_bytes()
            except OSError:
                continue  # ended while we looked
            if stat.rpartition(b")")[2].split()[0] != b"Z":
                live.add(int(pid))
        return live
    raise AssertionError(f"no pids cgroup found for container {cid}")


async def gone_after(cid: str, before: set[int], started: float) -> float:
    """Seconds from `started` until no live process other than those in `before` is left in the container."""
    deadline = time.monotonic() + GONE_BOUND_S
    while live_pids(cid) - before:
        if time.monotonic() > deadline:
            left = sorted(live_pids(cid) - before)
            raise AssertionError(f"the aborted call's processes were still alive after {GONE_BOUND_S} s: "
                                 + "; ".join(f"{pid} {_cmdline(pid)}" for pid in left[:5]))
        await asyncio.sleep(GONE_POLL_S)
    return time.monotonic() - started


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "(gone)"


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def neighbour_call_ms(client: AsyncClient, session_id: str) -> float:
    started = time.monotonic()
    # The neighbour repeats one call: its third meets the doom_loop ask, approved as a user would.
    out = await client.execute_tool(session_id, "bash", {"command": "echo ok", "description": "Neighbour"},
                                    on_permission=allow_once)
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
    cid = container_id(plane, victim.sandbox_id)
    # The session's first tool call starts its long-lived helpers (the custom-tool hosts): not the attack's.
    await neighbour_call_ms(plane.client, victim.id)
    for _ in range(aborts):
        before = live_pids(cid)
        call = RunningCall(plane.client, victim.id, ATTACKS[attack])
        await asyncio.sleep(WARMUP_S)
        for _ in range(per_round):
            measured.health_ms.append(await agent_health_latency(plane, victim.sandbox_id) * 1000)
            measured.neighbour_ms.append(await neighbour_call_ms(plane.client, neighbour.id))
        started = time.monotonic()
        event = await call.abort()
        measured.result_ms.append((time.monotonic() - started) * 1000)
        measured.left_at_result.append(len(live_pids(cid) - before))
        measured.abort_ms.append(await gone_after(cid, before, started) * 1000)
        assert event.WhichOneof("event") == "result", event
    # What an aborted attack left behind (a disk fill stopped between its write and its rm).
    await plane.client.run(victim.id, command="rm -f /workspace/f /tmp/f")
    return measured


def report(measured: Measured, idle: list[float]) -> list[str]:
    health99, abort99 = p(measured.health_ms, 0.99), p(measured.abort_ms, 0.99)
    near99, idle99 = p(measured.neighbour_ms, 0.99), p(idle, 0.99)
    ratio = near99 / idle99 if idle99 else float("inf")

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    return [
        f"  {measured.attack:12s} agent health p50 {statistics.median(measured.health_ms):6.1f} ms, p99 "
        f"{health99:6.1f} ms (n={len(measured.health_ms)}; target p99 ≤ {TARGET_MS:.0f} ms) "
        f"{verdict(health99 <= TARGET_MS)}",
        f"  {'':12s} abort until gone p50 {statistics.median(measured.abort_ms):6.1f} ms, p99 {abort99:6.1f} ms, "
        f"max {max(measured.abort_ms):6.1f} ms (n={len(measured.abort_ms)}; result alone p99 "
        f"{p(measured.result_ms, 0.99):6.1f} ms; live at result max {max(measured.left_at_result)}; "
        f"target p99 ≤ {TARGET_MS:.0f} ms) {verdict(abort99 <= TARGET_MS)}",
        f"  {'':12s} neighbour call p50 {statistics.median(measured.neighbour_ms):6.1f} ms, p99 {near99:6.1f} ms, "
        f"idle p99 {idle99:6.1f} ms, ratio {ratio:4.2f}x (target ≤ {NEIGHBOUR_RATIO:.0f}x and ≤ {TARGET_MS:.0f} ms) "
        f"{verdict(ratio <= NEIGHBOUR_RATIO and near99 <= TARGET_MS)}",
    ]


async def section(quick: bool, only: str | None = None, aborts: int | None = None) -> list[str]:
    samples, default_aborts = (20, 2) if quick else (200, 10)
    aborts = aborts or default_aborts
    lines = [f"Under attack ({samples} health/neighbour samples and {aborts} aborts per attack):"]
    async with running_plane("docker", pool={"size": 0}) as plane:
        victim = await plane.client.create_session(memory_mb=256)
        neighbour = await plane.client.create_session()
        idle = await idle_baseline(plane, neighbour, samples)
        await neighbour_call_ms(plane.client, victim.id)  # helpers a first call starts are not the attack's
        for attack in [only] if only else ATTACKS:
            lines += report(await under_attack(plane, victim, neighbour, attack, samples, aborts), idle)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=list(ATTACKS), help="one attack instead of all")
    parser.add_argument("--aborts", type=int, help="aborts per attack (default 2 with --quick, else 10)")
    options = parser.parse_args()
    for line in event_loop.run(section(options.quick, options.only, options.aborts)):
        print(line)
