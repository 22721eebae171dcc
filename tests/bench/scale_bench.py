"""`make bench-scale`: the platform with many sessions at once, each row beside its baseline from the same run.

Sections (`--only NAME`, repeatable; `--quick` shortens every one):

* ``calls``: 8, 32 and 64 sessions, each with CALLS_PER_SESSION concurrent `bash` `echo hi` calls for
  CALL_WINDOW_S: throughput, p50/p99/p99.9, errors (must be 0) and CPU per call: the control plane's process
  (it runs as a process of its own, `controlplane serve`) plus everything the sessions' containers ran (their
  cgroups). Baseline: `docker exec CID bash -c 'echo hi'` on the same containers at the same concurrency (at
  most BASELINE_MAX_CONCURRENCY CLI processes at once: each is a Go binary of its own), its CPU the CLIs' (our
  children), the engine's daemons and the containers' shims, and the containers' cgroups.
* ``burst``: BURST_CREATES concurrent CreateSession against a warm pool of BURST_POOL: all must succeed, p50/p99,
  and the time until the pool is full again. Baseline: as many concurrent `docker run --rm` of the image.
* ``memory``: memory per idle session at 10, 100 and 200 sessions, with the defaults' host admission and
  quotas (which must admit them all): each container's cgroup anon ("rss") and file memory, the control
  plane's RSS, and where one idle sandbox's memory goes, process by process.
* ``upkeep``: a pool of UPKEEP_POOL sandboxes left alone for UPKEEP_WINDOW_S: the control plane's CPU plus the
  pooled sandboxes' cgroups, as a share of one CPU (target: at most 1 %).

Every section stops by itself (time windows, bounded waits) and removes its containers, volumes and scratch
dirs, also after a failure. Loopback only. /proc/loadavg is printed with every row: up to five other users
share this machine's two CPUs.

Run: `.venv/bin/python -m tests.bench.scale_bench [--quick] [--only calls]` (OCSB_TEST_IMAGE picks the image).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.client import AsyncClient, allow_once
from tests.bench import scale_measures as m
from tests.bench.bench_common import IMAGE, SCRATCH, percentile, progress, scratch_dir
from tests.bench.bench_plane import docker_cli, remove_scratch
from tests.bench.fairness_bench import ServedPlane, remove_leftovers, serve, stop_served
from tests.planes import running_plane

SESSION_COUNTS = (8, 32, 64)
CALLS_PER_SESSION = 4
CALL_WINDOW_S = 30.0
BASELINE_MAX_CONCURRENCY = 64
BURST_CREATES = 50
BURST_POOL = 10
MEMORY_COUNTS = (10, 100, 200)
SETTLE_S = 10.0
"""Idle time before the pool's upkeep is measured: the agents' start-up garbage is collected."""
MEMORY_IDLE_S = 70.0
"""Idle time before memory is read: past the spawner helper's linger (spawner.LINGER_S, 60 s), which a claimed
sandbox holds for its first idle minute (docs/performance.md, 2026-11-28 14:45)."""
UPKEEP_POOL = 50
UPKEEP_WINDOW_S = 60.0
CREATE_CONCURRENCY = 8
START_TIMEOUT_S = 120.0
POOL_TIMEOUT_S = 600.0
HOST_MARGIN_MIB = 3072
"""MemAvailable kept for the machine's other users: the memory section stops growing before it."""
SESSION_ESTIMATE_MIB = 80
"""What one more idle session may take from the host (its cgroup, its shim, the engine's share), to check first."""
BASH = {"command": "echo hi", "description": "Echo"}

QUICK_WINDOW_S = 8.0
QUICK_COUNTS = (8, 32)
QUICK_BURST = 20
QUICK_MEMORY = (10, 40)
QUICK_UPKEEP_POOL = 20
QUICK_UPKEEP_S = 20.0


RUNTIME: list[str] = []
"""The OCI runtime every section's sandboxes use (`--runtime runsc`: gVisor, whose own overhead is reported apart
from runc's); empty: the engine's default."""


def image() -> str:
    return os.environ.get("OCSB_TEST_IMAGE", IMAGE)


def provider_options() -> dict[str, str]:
    return {"runtime": RUNTIME[0]} if RUNTIME else {}


@dataclass
class Window:
    """Calls made by concurrent workers until a deadline."""

    samples_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)

    def row(self, name: str, concurrency: int) -> str:
        calls = len(self.samples_ms)
        cpu = sum(self.cpu_s.values()) / calls * 1000 if calls else float("nan")
        split = " + ".join(f"{k} {v / calls * 1000:.2f}" for k, v in self.cpu_s.items()) if calls else "-"
        pcts = "/".join(f"{percentile(self.samples_ms, p):.1f}" for p in (50, 99, 99.9))
        return (f"  {name:34} {concurrency:5} {calls / self.wall_s if self.wall_s else 0:8.1f} {pcts:>22} "
                f"{cpu:8.2f} ({split}) errors {len(self.errors)}{' ' + self.errors[0][:120] if self.errors else ''}")


async def run_window(call: Callable[[int], Awaitable[None]], concurrency: int, window_s: float) -> Window:
    out = Window()
    deadline = time.monotonic() + window_s

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                await call(index)
            except Exception as exc:  # a failed call is counted and shown, and the worker goes on
                out.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            out.samples_ms.append((time.perf_counter() - started) * 1000)

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    out.wall_s = time.monotonic() - started
    return out


# -- a control plane of its own (its CPU and memory are its own) -----------------------------------


async def start_served(pool: int) -> tuple[ServedPlane, AsyncClient]:
    instance = f"bench-scale-{secrets.token_hex(3)}"
    data_dir = scratch_dir("ocsb-bench-scale-")
    config = data_dir / "config.toml"
    # Only what a bench must set: everything else (admission, quotas, limits) is the defaults'.
    config.write_text("\n".join([
        f'data_dir = "{data_dir}"', f'instance = "{instance}"',
        "[server]", 'listen = "127.0.0.1:0"',
        "[provider]", 'type = "docker"', f'image = "{image()}"', *(f'runtime = "{r}"' for r in RUNTIME),
        "[pool]", f"size = {pool}", "",
    ]))
    plane = await serve(config, data_dir, instance, START_TIMEOUT_S)
    return plane, AsyncClient(plane.address, (data_dir / "default.token").read_text().strip())


@contextlib.asynccontextmanager
async def served(pool: int) -> AsyncIterator[tuple[ServedPlane, AsyncClient]]:
    plane, client = await start_served(pool)
    try:
        yield plane, client
    finally:
        with contextlib.suppress(Exception):
            await client.close()
        await stop_served(plane)
        await remove_leftovers(plane)


async def session_containers(instance: str) -> dict[str, str]:
    """session id -> container id, for the instance's containers that hold a session."""
    listed = await docker_cli("ps", "--no-trunc", "--filter", f"label=ocsb.instance={instance}",
                              "--format", '{{.ID}} {{.Label "ocsb.session"}}')
    pairs = (line.split() for line in listed.splitlines())
    return {p[1]: p[0] for p in pairs if len(p) == 2}


async def create_many(client: AsyncClient, n: int) -> tuple[list[str], list[str]]:
    """Creates n sessions, CREATE_CONCURRENCY at a time; returns their ids and the errors of those refused."""
    made: list[str] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one() -> None:
        async with gate:
            try:
                made.append((await client.create_session()).id)
            except Exception as exc:  # a refusal is the finding (admission, quota): reported, not raised
                errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one() for _ in range(n)))
    return made, errors


async def delete_many(client: AsyncClient, ids: list[str]) -> None:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(sid: str) -> None:
        async with gate:
            with contextlib.suppress(Exception):
                await client.delete_session(sid)

    await asyncio.gather(*(one(s) for s in ids))


# -- calls -----------------------------------------------------------------------------------------


async def calls_section(quick: bool) -> list[str]:
    window_s = QUICK_WINDOW_S if quick else CALL_WINDOW_S
    counts = QUICK_COUNTS if quick else SESSION_COUNTS
    lines = [f"calls: N sessions x {CALLS_PER_SESSION} concurrent `bash` `echo hi` for {window_s:g} s; CPU per call "
             "in ms (plane: the control plane's process; sandboxes: the containers' cgroups; docker: CLIs + engine "
             "daemons + shims)",
             f"  {'row':34} {'conc':>5} {'calls/s':>8} {'p50/p99/p99.9 ms':>22} {'CPU/call ms':>8}"]
    async with served(pool=0) as (plane, client):
        for n in counts:
            progress(f"scale calls: {n} sessions")
            ids, refused = await create_many(client, n)
            if refused:
                lines.append(f"  {n} sessions: {len(refused)} creates refused: {refused[0][:200]}")
            cids_by_session = await session_containers(plane.instance)
            cids = [cids_by_session[s] for s in ids if s in cids_by_session]
            for sid in ids:
                await client.execute_tool(sid, "bash", BASH, on_permission=allow_once)
            ours = await measure_calls(plane, client, ids, cids, window_s)
            base = await measure_docker_exec(cids, window_s)
            client_cpu = ours.cpu_s.pop("client")
            lines.append(ours.row(f"{len(ids)} sessions: platform", len(ids) * CALLS_PER_SESSION))
            lines.append(base.row(f"{len(cids)} sessions: docker exec", baseline_concurrency(cids)))
            lines.append(f"    load {m.load()}; the bench's client (not counted above): "
                         f"{client_cpu / max(len(ours.samples_ms), 1) * 1000:.2f} ms CPU per call")
            await delete_many(client, ids)
    return lines


async def measure_calls(plane: ServedPlane, client: AsyncClient, ids: list[str], cids: list[str],
                        window_s: float) -> Window:
    async def call(index: int) -> None:
        out = await client.execute_tool(ids[index // CALLS_PER_SESSION], "bash", BASH, on_permission=allow_once)
        if out.output != "hi\n" or out.error is not None:
            raise RuntimeError(f"bash answered {out.output!r} {out.error!r}")

    plane_cpu, box_cpu = plane.cpu_seconds(), sum(m.container_cpu_s(c) for c in cids)
    mine = resource.getrusage(resource.RUSAGE_SELF)
    window = await run_window(call, len(ids) * CALLS_PER_SESSION, window_s)
    after = resource.getrusage(resource.RUSAGE_SELF)
    window.cpu_s = {"plane": plane.cpu_seconds() - plane_cpu,
                    "sandboxes": sum(m.container_cpu_s(c) for c in cids) - box_cpu}
    window.cpu_s["client"] = (after.ru_utime + after.ru_stime) - (mine.ru_utime + mine.ru_stime)
    return window


def baseline_concurrency(cids: list[str]) -> int:
    return min(len(cids) * CALLS_PER_SESSION, BASELINE_MAX_CONCURRENCY)


async def measure_docker_exec(cids: list[str], window_s: float) -> Window:
    async def call(index: int) -> None:
        process = await asyncio.create_subprocess_exec(
            "docker", "exec", cids[index % len(cids)], "bash", "-c", "echo hi",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        if process.returncode != 0 or out != b"hi\n":
            raise RuntimeError(f"docker exec: {process.returncode} {err.decode(errors='replace')[:200]}")

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    engine, boxes = m.engine_cpu_s(cids), sum(m.container_cpu_s(c) for c in cids)
    window = await run_window(call, baseline_concurrency(cids), window_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    window.cpu_s = {"docker": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                    + m.engine_cpu_s(cids) - engine,
                    "sandboxes": sum(m.container_cpu_s(c) for c in cids) - boxes}
    return window


# -- burst -----------------------------------------------------------------------------------------


async def burst_section(quick: bool) -> list[str]:
    creates = QUICK_BURST if quick else BURST_CREATES
    lines = [f"burst: {creates} concurrent CreateSession with a warm pool of {BURST_POOL} (refill concurrency 2)",
             f"  {'row':34} {'ok':>5} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}"]
    progress(f"scale burst: {creates} creates")
    async with running_plane("docker", pool={"size": BURST_POOL, "refill_concurrency": 2},
                             provider_options=provider_options()) as served_plane:
        provider = served_plane.plane.sessions._provider  # the bench looks at the pool it measures

        def full() -> bool:
            stats = provider.pool_stats()
            return stats.ready >= stats.target and stats.creating == 0

        await wait_for(full, POOL_TIMEOUT_S, "the pool to fill")
        times: list[float] = []
        errors: list[str] = []

        async def one() -> str | None:
            started = time.perf_counter()
            try:
                made = await served_plane.client.create_session()
            except Exception as exc:  # must not happen: counted and shown
                errors.append(f"{type(exc).__name__}: {exc}")
                return None
            times.append((time.perf_counter() - started) * 1000)
            return made.id

        started = time.monotonic()
        made = await asyncio.gather(*(one() for _ in range(creates)))
        ended = time.monotonic()
        refilled = await wait_for(full, POOL_TIMEOUT_S, "the pool to refill")
        refill_s = refilled - started
        lines.append(f"  {'platform (pool ' + str(BURST_POOL) + ')':34} {len(times):5} {percentile(times, 50):9.0f} "
                     f"{percentile(times, 99):9.0f} {max(times, default=0):9.0f}  errors {len(errors)}"
                     f"{' ' + errors[0][:160] if errors else ''}; burst took {ended - started:.1f} s, "
                     f"pool full again {refill_s:.1f} s after it began")
        await delete_many(served_plane.client, [s for s in made if s])
        base, base_errors = await docker_run_burst(creates, served_plane.instance)
        lines.append(f"  {'docker run --rm (same concurrency)':34} {len(base):5} {percentile(base, 50):9.0f} "
                     f"{percentile(base, 99):9.0f} {max(base, default=0):9.0f}  errors {base_errors}")
    lines.append(f"    load {m.load()}")
    return lines


async def wait_for(ready: Callable[[], bool], timeout_s: float, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic()


async def docker_run_burst(n: int, instance: str) -> tuple[list[float], int]:
    args = ["run", "--rm", "--network", "none", *(f"--runtime={r}" for r in RUNTIME),
            "--label", f"ocsb.instance={instance}", "--label",
            "ocsb.managed=true", "--entrypoint", "true", image()]

    async def one() -> float | None:
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec("docker", *args, stdout=asyncio.subprocess.DEVNULL,
                                                       stderr=asyncio.subprocess.DEVNULL)
        return (time.perf_counter() - started) * 1000 if await process.wait() == 0 else None

    done = await asyncio.gather(*(one() for _ in range(n)))
    return [t for t in done if t is not None], sum(t is None for t in done)


# -- memory ----------------------------------------------------------------------------------------


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def memory_section(quick: bool) -> list[str]:
    counts = QUICK_MEMORY if quick else MEMORY_COUNTS
    lines = ["memory per idle session (pool 0, default admission and quotas; cgroup v1 rss = anon; MiB)",
             f"  {'sessions':>8} {'anon p50':>9} {'anon max':>9} {'file p50':>9} {'charged p50':>11} "
             f"{'plane RSS':>10} {'host used/session':>18}"]
    breakdown: list[m.ProcessMemory] = []
    async with served(pool=0) as (plane, client):
        ids: list[str] = []
        host_before = mem_available_mib()
        for n in counts:
            want = n - len(ids)
            room = (mem_available_mib() - HOST_MARGIN_MIB) / SESSION_ESTIMATE_MIB
            if want > room:
                lines.append(f"  stopped before {n}: MemAvailable {mem_available_mib():.0f} MiB leaves room for "
                             f"{max(room, 0):.0f} more sessions above the {HOST_MARGIN_MIB} MiB kept for others")
                break
            progress(f"scale memory: {n} sessions")
            made, refused = await create_many(client, want)
            ids += made
            if refused:
                lines.append(f"  {n}: {len(refused)} creates refused (admission or quota): {refused[0][:240]}")
            await asyncio.sleep(MEMORY_IDLE_S)
            cids = list((await session_containers(plane.instance)).values())
            mems = [x for x in (m.container_memory(c) for c in cids) if x is not None]
            anon = [x.anon_mib for x in mems]
            lines.append(f"  {len(mems):8} {percentile(anon, 50):9.1f} {max(anon, default=0):9.1f} "
                         f"{percentile([x.file_mib for x in mems], 50):9.1f} "
                         f"{percentile([x.usage_mib for x in mems], 50):11.1f} "
                         f"{m.process_rss_mib(plane.process.pid):10.0f} "
                         f"{(host_before - mem_available_mib()) / max(len(ids), 1):18.1f}   load {m.load()}")
            if not breakdown and cids:
                breakdown = m.container_breakdown(cids[0])
        await delete_many(client, ids)
    lines.append("  one idle sandbox, process by process (smaps_rollup on the host; Pss, MiB):")
    for proc in breakdown:
        lines.append(f"    anon {proc.anon_mib:5.1f} file {proc.file_mib:5.1f} threads {proc.threads:3}  "
                     f"{proc.command[:90]}")
    lines.append("  (host used/session: the drop of the host's MemAvailable over the live sessions: the engine's and "
                 "the shims' share too, and everything else the machine's other users did meanwhile)")
    return lines


# -- upkeep ----------------------------------------------------------------------------------------


async def upkeep_section(quick: bool) -> list[str]:
    size = QUICK_UPKEEP_POOL if quick else UPKEEP_POOL
    window = QUICK_UPKEEP_S if quick else UPKEEP_WINDOW_S
    progress(f"scale upkeep: a pool of {size}")
    async with running_plane("docker", pool={"size": size, "refill_concurrency": 2},
                             provider_options=provider_options()) as served_plane:
        provider = served_plane.plane.sessions._provider  # the bench looks at the pool it measures

        def full() -> bool:
            stats = provider.pool_stats()
            return stats.ready >= stats.target and stats.creating == 0

        await wait_for(full, POOL_TIMEOUT_S, "the pool to fill")
        await asyncio.sleep(SETTLE_S)
        cids = (await docker_cli("ps", "-q", "--no-trunc", "--filter",
                                 f"label=ocsb.instance={served_plane.instance}")).split()
        # The control plane runs in this process, which does nothing else meanwhile but sleep.
        before = resource.getrusage(resource.RUSAGE_SELF)
        boxes = sum(m.container_cpu_s(c) for c in cids)
        started = time.monotonic()
        await asyncio.sleep(window)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        plane_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        box_cpu = sum(m.container_cpu_s(c) for c in cids) - boxes
    share = (plane_cpu + box_cpu) / wall
    return [f"upkeep: a pool of {len(cids)} idle sandboxes over {wall:.0f} s (target: at most 1 % of a CPU)",
            f"  control plane {plane_cpu / wall:.3%} of a CPU, sandboxes' cgroups {box_cpu / wall:.3%} "
            f"({box_cpu / wall / max(len(cids), 1):.4%} each); together {share:.3%} "
            f"{'PASS' if share <= 0.01 else 'FAIL'}; load {m.load()}"]


SECTIONS: dict[str, Callable[[bool], Awaitable[list[str]]]] = {
    "calls": calls_section, "burst": burst_section, "memory": memory_section, "upkeep": upkeep_section,
}


async def run(quick: bool, only: list[str]) -> None:
    runtime = RUNTIME[0] if RUNTIME else "the engine's default"
    print(f"bench-scale ({'quick' if quick else 'full'}), image {image()}, runtime {runtime}, load at start {m.load()}",
          flush=True)
    for name, section in SECTIONS.items():
        if only and name not in only:
            continue
        started = time.monotonic()
        try:
            lines = await section(quick)
        except Exception as exc:  # one section's failure is printed; the others still run
            lines = [f"{name}: FAILED: {type(exc).__name__}: {exc}"]
        print("\n".join([*lines, f"  ({name}: {time.monotonic() - started:.0f} s)"]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows and fewer sessions")
    parser.add_argument("--only", action="append", choices=list(SECTIONS), default=[])
    parser.add_argument("--runtime", default="", help="the OCI runtime of every sandbox (runsc: gVisor)")
    args = parser.parse_args()
    if args.runtime:
        RUNTIME.append(args.runtime)
    try:
        asyncio.run(run(args.quick, args.only))
    finally:
        for line in remove_scratch(SCRATCH):
            progress(f"removed {line}")


if __name__ == "__main__":
    main()
