"""Idle sandbox memory in the three states a sandbox idles in, and what a fresh session's first call pays.

States (N sandboxes each, runc, one control plane with a pool of N):

* ``pooled``: sandboxes in the warm pool, never claimed;
* ``claimed``: the same sandboxes right after N CreateSession took them, no tool run;
* ``after calls``: each then ran CALLS `bash` `echo hi` and was left alone.

Each state is read SETTLE_S after it was reached and, for the two claimed states, again after LINGER_S (the
spawner helper's idle linger, spawner.LINGER_S, plus a margin): cgroup anon (v1 `rss`, v2 `anon`: the
target's "cgroup rss") of every container, and each process's Pss_Anon from smaps_rollup (read on the host).

``first call``: FIRST_CALLS sessions one after another, each claimed from a full pool (the pool refills in
between), timed on its first `bash` `echo hi` right after CreateSession returned; p50 and all samples.

``after idle``: N sessions each left alone LINGER_S after a call, then timed on one call (its helper is started
again) and on the call right after it.

Run: `.venv/bin/python -m tests.bench.idle_memory_bench [--n 4] [--first-calls 10]` (OCSB_TEST_IMAGE picks the
image). Loopback only; removes its containers and scratch dirs.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from controlplane.client import allow_once
from tests.bench import scale_measures as m
from tests.bench.bench_common import percentile, progress
from tests.bench.bench_plane import docker_cli
from tests.bench.scale_bench import BASH, image, served

SETTLE_S = 10.0
LINGER_S = 75.0
"""Longer than the spawner helper's linger (60 s): the claimed states are read again after it."""
CALLS = 3
POOL_WAIT_S = 120.0


async def sandbox_containers(instance: str) -> dict[str, str]:
    """sandbox id -> container id, for every container of the instance."""
    listed = await docker_cli("ps", "--no-trunc", "--filter", f"label=ocsb.instance={instance}",
                              "--format", '{{.ID}} {{.Label "ocsb.sandbox"}}')
    pairs = (line.split() for line in listed.splitlines())
    return {p[1]: p[0] for p in pairs if len(p) == 2}


async def wait_pool(instance: str, claimed: set[str], n: int) -> list[str]:
    """The container ids of n pooled (unclaimed) sandboxes, once there are n."""
    deadline = time.monotonic() + POOL_WAIT_S
    while True:
        pooled = [c for s, c in (await sandbox_containers(instance)).items() if s not in claimed]
        if len(pooled) >= n:
            return pooled[:n]
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not fill: {len(pooled)} of {n}")
        await asyncio.sleep(0.2)


def row(state: str, cids: list[str]) -> str:
    anon = [x.anon_mib for x in (m.container_memory(c) for c in cids) if x is not None]
    per_role: dict[str, list[float]] = {"agent": [], "helper": [], "tini": [], "other": []}
    for cid in cids:
        for proc in m.container_breakdown(cid):
            role = ("tini" if "init" in proc.command.split(" ")[0] else "helper" if "spawner_helper" in proc.command
                    else "agent" if "sandbox_agent" in proc.command else "other")
            per_role[role].append(proc.anon_mib)
    parts = " ".join(f"{k} {sum(v) / len(cids):.2f}({len(v)})" for k, v in per_role.items() if v)
    return (f"  {state:28} cgroup anon p50 {percentile(anon, 50):6.2f} max {max(anon, default=0):6.2f} MiB | "
            f"per sandbox: {parts} | load {m.load()}")


async def memory(n: int) -> list[str]:
    lines = [f"idle memory, {n} sandboxes per state (MiB; per process: Pss_Anon mean per sandbox (processes))"]
    async with served(pool=n) as (plane, client):
        pooled = await wait_pool(plane.instance, set(), n)
        await asyncio.sleep(SETTLE_S)
        lines.append(row("pooled", pooled))
        progress("idle memory: claiming")
        sessions = [await client.create_session() for _ in range(n)]
        by_sandbox = await sandbox_containers(plane.instance)
        cids = [by_sandbox[s.sandbox_id] for s in sessions]
        await asyncio.sleep(SETTLE_S)
        lines.append(row(f"claimed, {SETTLE_S:g} s", cids))
        await asyncio.sleep(LINGER_S)
        lines.append(row(f"claimed, {SETTLE_S + LINGER_S:g} s", cids))
        for s in sessions:
            for _ in range(CALLS):
                out = await client.execute_tool(s.id, "bash", BASH, on_permission=allow_once)
                if out.error:
                    raise RuntimeError(f"bash failed: {out.error}")
        await asyncio.sleep(SETTLE_S)
        lines.append(row(f"after {CALLS} calls, {SETTLE_S:g} s", cids))
        await asyncio.sleep(LINGER_S)
        lines.append(row(f"after {CALLS} calls, {SETTLE_S + LINGER_S:g} s", cids))
        for s in sessions:
            await client.delete_session(s.id)
    return lines


async def first_calls(count: int) -> list[str]:
    samples: list[float] = []
    async with served(pool=2) as (plane, client):
        claimed: set[str] = set()
        for _ in range(count):
            await wait_pool(plane.instance, claimed, 2)
            await asyncio.sleep(2.0)  # the refilled sandbox's agent serving and settled
            session = await client.create_session()
            claimed.add(session.sandbox_id)
            started = time.perf_counter()
            out = await client.execute_tool(session.id, "bash", BASH, on_permission=allow_once)
            samples.append((time.perf_counter() - started) * 1000)
            if out.error:
                raise RuntimeError(f"bash failed: {out.error}")
            await client.delete_session(session.id)
    shown = " ".join(f"{s:.0f}" for s in samples)
    return [f"first call (bash echo right after a pooled CreateSession), {count} sessions: "
            f"p50 {percentile(samples, 50):.1f} ms; samples {shown}; load {m.load()}"]


async def after_idle(count: int) -> list[str]:
    """A call after LINGER_S of idleness (its helper gone, started again) against the call right after it."""
    async with served(pool=0) as (_, client):
        sessions = [await client.create_session() for _ in range(count)]

        async def timed(sid: str) -> float:
            started = time.perf_counter()
            out = await client.execute_tool(sid, "bash", BASH, on_permission=allow_once)
            if out.error:
                raise RuntimeError(f"bash failed: {out.error}")
            return (time.perf_counter() - started) * 1000

        for s in sessions:
            await timed(s.id)
        await asyncio.sleep(LINGER_S)
        idle, warm = [], []
        for s in sessions:  # one at a time: each call alone on the machine's share
            idle.append(await timed(s.id))
            warm.append(await timed(s.id))
        for s in sessions:
            await client.delete_session(s.id)
    return [f"call after {LINGER_S:g} s idle: p50 {percentile(idle, 50):.1f} ms ({' '.join(f'{x:.0f}' for x in idle)});"
            f" the next call p50 {percentile(warm, 50):.1f} ms ({' '.join(f'{x:.0f}' for x in warm)}); load {m.load()}"]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--first-calls", type=int, default=10)
    parser.add_argument("--only", choices=("memory", "first", "after-idle"), default=None)
    args = parser.parse_args()
    lines = [f"image {image()}"]
    if args.only in (None, "memory"):
        lines += await memory(args.n)
    if args.only in (None, "first"):
        lines += await first_calls(args.first_calls)
    if args.only in (None, "after-idle"):
        lines += await after_idle(args.n)
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
