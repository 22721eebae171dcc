"""Latency benchmark of the control plane against plain Docker, all measured in one run.

Rows (each reports p50/p99 over its samples, wall-clock time seen by the caller):

* ``session create (warm pool)`` -- ``AsyncClient.create_session()`` (no workspace) through the real
  gRPC API while the warm pool is full. After each sample the session is deleted and the benchmark
  waits (untimed) until the pool is full again, so every sample is a pool hit.
* ``session create (cold)`` -- the same call against a second control plane with pool size 0, so every
  sample creates, hardens and starts a container and waits for its agent.
* ``exec round trip`` -- ``AsyncClient.run(session, ["true"])`` in one READY session (client -> control
  plane -> agent -> fork/exec -> exit status back), after a warm-up.
* Baselines: ``docker run --rm --network none --entrypoint true <image>`` and ``docker exec <cid> true``
  via the Docker CLI against the session's own container, plus docker-py ``exec_run`` for the same.
* Diagnostics (``diag:`` rows, no target): the control plane's own channel to the session's agent, a
  unary Health call and an Exec of ``true`` -- the exec round trip minus the public gRPC hop.

The control planes run in this process (``controlplane.app.start``) on 127.0.0.1 with an ephemeral port
and their own instance labels; every container they or the baselines start is removed at the end and the
engine is checked for leftovers. Targets from the design: warm acquire p50 <= 30 ms; exec round trip p50
<= 3 ms and at least 20x faster than ``docker exec``. The script reports PASS/FAIL but always exits 0.

Usage: ``.venv/bin/python tests/bench/bench.py [--quick] [--samples-scale F]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.core.execution import CommandSpec, Exited

IMAGE = "ocsb-sandbox:latest"
WARM_TARGET_MS = 30.0
EXEC_TARGET_MS = 3.0
EXEC_MIN_SPEEDUP = 20.0
POOL_SIZE = 2
POOL_REFILL_TIMEOUT_S = 60.0

DEFAULT_SAMPLES = {
    "warm": 30,
    "cold": 10,
    "exec": 300,
    "exec_warmup": 20,
    "docker_run": 10,
    "docker_exec": 30,
    "dockerpy_exec": 30,
    "diag": 100,
}
QUICK_FACTOR = 0.2


@dataclass(frozen=True)
class Row:
    name: str
    samples_ms: list[float]

    @property
    def p50(self) -> float:
        return percentile(self.samples_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 99)


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no samples."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def sample_counts(quick: bool, scale: float) -> dict[str, int]:
    factor = scale * (QUICK_FACTOR if quick else 1.0)
    return {k: max(3, round(v * factor)) for k, v in DEFAULT_SAMPLES.items()}


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000.0


class AsyncioErrorCounter(logging.Filter):
    """Counts (and unless verbose, hides) asyncio's "Task was destroyed"/"never retrieved" reports."""

    def __init__(self, show: bool) -> None:
        super().__init__()
        self.show = show
        self.counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            key = record.getMessage().splitlines()[0]
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.show
        return True


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


# -- docker CLI ------------------------------------------------------------------------------------


async def docker_cli(*args: str, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({proc.returncode}): {err.decode(errors='replace')}")
    return out.decode()


async def leftovers(instance: str) -> tuple[list[str], list[str]]:
    """Container ids and volume names still labelled with `instance`."""
    label = f"label=ocsb.instance={instance}"
    containers = (await docker_cli("ps", "-aq", "--no-trunc", "--filter", label)).split()
    volumes = (await docker_cli("volume", "ls", "-q", "--filter", label)).split()
    return containers, volumes


# -- control plane ---------------------------------------------------------------------------------


@dataclass
class Plane:
    plane: app.ControlPlane
    client: AsyncClient
    instance: str
    data_dir: Path

    def pool_full(self) -> bool:
        stats = self.plane.sessions._provider.pool_stats()
        return stats.ready >= stats.target and stats.creating == 0

    def pool_hits(self) -> int:
        return self.plane.sessions._provider.pool_stats().hits

    async def wait_pool_full(self) -> None:
        deadline = time.monotonic() + POOL_REFILL_TIMEOUT_S
        while not self.pool_full():
            if time.monotonic() > deadline:
                stats = self.plane.sessions._provider.pool_stats()
                raise RuntimeError(f"warm pool did not refill within {POOL_REFILL_TIMEOUT_S} s: {stats}")
            await asyncio.sleep(0.01)


async def start_plane(instance: str, pool_size: int) -> Plane:
    data_dir = Path(tempfile.mkdtemp(prefix="ocb", dir="/tmp"))
    settings = load_settings(
        None,
        data_dir=data_dir,
        instance=instance,
        pool={"size": pool_size, "refill_concurrency": 2},
        server={"listen": "127.0.0.1:0"},
    )
    plane = await app.start(settings)
    token = settings.token_file.read_text().strip()
    return Plane(plane, AsyncClient(plane.address, token), instance, data_dir)


async def stop_plane(p: Plane) -> None:
    with contextlib.suppress(Exception):
        await p.client.close()
    await app.stop(p.plane)


# -- measurements ----------------------------------------------------------------------------------


async def bench_create(p: Plane, n: int, warm: bool) -> tuple[list[float], int]:
    """Create+delete `n` sessions, timing only the create; returns samples and pool misses seen."""
    samples: list[float] = []
    misses = 0
    for _ in range(n):
        if warm:
            await p.wait_pool_full()
        hits_before = p.pool_hits()
        start = time.perf_counter()
        session = await p.client.create_session()
        samples.append((time.perf_counter() - start) * 1000.0)
        if warm and p.pool_hits() != hits_before + 1:
            misses += 1
        await p.client.delete_session(session.id)
    return samples, misses


async def bench_exec(client: AsyncClient, session_id: str, n: int, warmup: int) -> list[float]:
    async def once() -> None:
        result = await client.run(session_id, ["true"])
        if result.exit_code != 0:
            raise RuntimeError(f"`true` exited {result.exit_code}: {result.stderr!r}")

    for _ in range(warmup):
        await once()
    return [await timed(once) for _ in range(n)]


async def bench_agent_direct(p: Plane, sandbox_id: str, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Diagnostics: the control plane's own channel to the agent, skipping the public gRPC hop."""
    sandbox = await p.plane.sessions._provider.get(sandbox_id)

    async def health() -> None:
        await sandbox.agent.health()

    async def exec_true() -> None:
        stream = await sandbox.agent.exec(CommandSpec(argv=["true"]))
        async for event in stream.events():
            if isinstance(event, Exited) and event.exit_code != 0:
                raise RuntimeError(f"`true` exited {event.exit_code} in the agent")

    for _ in range(warmup):
        await health()
        await exec_true()
    return [await timed(health) for _ in range(n)], [await timed(exec_true) for _ in range(n)]


async def bench_docker_exec(container_id: str, n: int) -> list[float]:
    await docker_cli("exec", container_id, "true")  # warm-up
    return [await timed(lambda: docker_cli("exec", container_id, "true")) for _ in range(n)]


async def bench_dockerpy_exec(container_id: str, n: int) -> list[float]:
    client = await asyncio.to_thread(docker.from_env)
    try:
        container: Any = await asyncio.to_thread(client.containers.get, container_id)

        def run() -> None:
            result = container.exec_run(["true"])
            if result.exit_code != 0:
                raise RuntimeError(f"docker-py exec_run `true` exited {result.exit_code}")

        await asyncio.to_thread(run)  # warm-up
        return [await timed(lambda: asyncio.to_thread(run)) for _ in range(n)]
    finally:
        await asyncio.to_thread(client.close)


async def bench_docker_run(label: str, n: int) -> list[float]:
    args = ("run", "--rm", "--network", "none", "--label", label, "--entrypoint", "true", IMAGE)
    await docker_cli(*args)  # warm-up
    return [await timed(lambda: docker_cli(*args)) for _ in range(n)]


# -- report ----------------------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def speedup(baseline: Row | None, row: Row | None) -> str:
    if baseline is None or row is None or not baseline.samples_ms or not row.samples_ms:
        return "n/a"
    ratio = baseline.p50 / row.p50
    return f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def print_report(rows: dict[str, Row], notes: list[str]) -> None:
    print()
    header = f"{'measurement':<38} {'n':>5} {'p50 ms':>10} {'p99 ms':>10} {'min ms':>10} {'max ms':>10}"
    print(header)
    print("-" * len(header))
    for row in rows.values():
        s = row.samples_ms
        lo = min(s) if s else math.nan
        hi = max(s) if s else math.nan
        cells = " ".join(f"{fmt_ms(v):>10}" for v in (row.p50, row.p99, lo, hi))
        print(f"{row.name:<38} {len(s):>5} {cells}")

    warm, cold = rows.get("warm"), rows.get("cold")
    exec_row, docker_run, docker_exec = rows.get("exec"), rows.get("docker_run"), rows.get("docker_exec")
    dockerpy_exec = rows.get("dockerpy_exec")
    print()
    print("ratios (p50 of baseline / p50 of measurement):")
    print(f"  warm create  vs docker run --rm     : {speedup(docker_run, warm)}")
    print(f"  cold create  vs docker run --rm     : {speedup(docker_run, cold)}")
    print(f"  exec         vs docker exec (CLI)   : {speedup(docker_exec, exec_row)}")
    print(f"  exec         vs docker-py exec_run  : {speedup(dockerpy_exec, exec_row)}")
    agent_exec = rows.get("agent_exec")
    if exec_row is not None and agent_exec is not None and exec_row.samples_ms and agent_exec.samples_ms:
        hop = exec_row.p50 - agent_exec.p50
        print(f"  exec p50 in the public API hop (exec - diag agent Exec, measured apart): ~{hop:.2f} ms")

    print()
    print("targets:")
    if warm is not None and warm.samples_ms:
        ok = warm.p50 <= WARM_TARGET_MS
        print(f"  {'PASS' if ok else 'FAIL'}  warm acquire p50 {warm.p50:.2f} ms <= {WARM_TARGET_MS:g} ms")
    else:
        print("  FAIL  warm acquire: not measured")
    if exec_row is not None and exec_row.samples_ms and docker_exec is not None and docker_exec.samples_ms:
        ratio = docker_exec.p50 / exec_row.p50
        ok = exec_row.p50 <= EXEC_TARGET_MS and ratio >= EXEC_MIN_SPEEDUP
        print(
            f"  {'PASS' if ok else 'FAIL'}  exec round trip p50 {exec_row.p50:.2f} ms <= {EXEC_TARGET_MS:g} ms "
            f"and {ratio:.1f}x >= {EXEC_MIN_SPEEDUP:g}x faster than docker exec"
        )
    else:
        print("  FAIL  exec round trip: not measured")
    if notes:
        print()
        print("notes:")
        for note in notes:
            print(f"  - {note}")


# -- main ------------------------------------------------------------------------------------------


async def cleanup(instances: list[str], planes: list[Plane], data_dirs: list[Path], notes: list[str]) -> None:
    for p in planes:
        try:
            await stop_plane(p)
        except Exception as exc:
            notes.append(f"stopping control plane {p.instance} failed: {exc!r}")
    for instance in instances:
        try:
            containers, volumes = await leftovers(instance)
        except (OSError, RuntimeError) as exc:
            notes.append(f"instance {instance}: STILL LEFT? could not list leftovers: {exc!r}")
            continue
        for cid in containers:
            await docker_cli("rm", "-f", "-v", cid, check=False)
        for volume in volumes:
            await docker_cli("volume", "rm", "-f", volume, check=False)
        if containers or volumes:
            notes.append(
                f"instance {instance}: removed {len(containers)} leftover container(s) "
                f"{[c[:12] for c in containers]} and {len(volumes)} volume(s) {volumes}"
            )
        remaining, remaining_volumes = await leftovers(instance) if containers or volumes else ([], [])
        if remaining or remaining_volumes:
            notes.append(f"instance {instance}: STILL LEFT {remaining} {remaining_volumes}")
    for data_dir in data_dirs:
        await asyncio.to_thread(shutil.rmtree, data_dir, True)
    notes.append(f"cleanup checked: no containers or volumes left for {', '.join(instances)}"
                 if not any("STILL LEFT" in n for n in notes) else "cleanup incomplete, see above")


async def environment() -> str:
    server = (await docker_cli("version", "--format", "{{.Server.Version}}", check=False)).strip() or "?"
    return f"python {sys.version.split()[0]}, docker engine {server}, {os.cpu_count()} CPUs"


async def run(args: argparse.Namespace, asyncio_errors: AsyncioErrorCounter) -> None:
    counts = sample_counts(args.quick, args.samples_scale)
    prefix = f"bench-{secrets.token_hex(4)}"
    warm_instance, cold_instance, base_instance = f"{prefix}-w", f"{prefix}-c", f"{prefix}-b"
    instances = [warm_instance, cold_instance, base_instance]
    rows: dict[str, Row] = {}
    notes: list[str] = []
    planes: list[Plane] = []
    data_dirs: list[Path] = []
    wall = time.perf_counter()
    print(f"benchmark {prefix}: samples {counts}", file=sys.stderr, flush=True)
    env = await environment()
    try:
        progress(f"starting control plane {warm_instance} (pool size {POOL_SIZE})")
        warm = await start_plane(warm_instance, POOL_SIZE)
        planes.append(warm)
        data_dirs.append(warm.data_dir)
        await warm.wait_pool_full()

        progress(f"session create (warm pool) x{counts['warm']}")
        samples, misses = await bench_create(warm, counts["warm"], warm=True)
        rows["warm"] = Row("session create (warm pool)", samples)
        if misses:
            notes.append(f"{misses} warm-create sample(s) were not pool hits")

        await warm.wait_pool_full()
        session = await warm.client.create_session()
        container_id = f"ocsb-{warm_instance}-{session.sandbox_id}"
        try:
            await warm.wait_pool_full()  # no container creation in the background while measuring exec
            progress(f"exec round trip x{counts['exec']} (+{counts['exec_warmup']} warm-up)")
            rows["exec"] = Row("exec round trip (true)", await bench_exec(
                warm.client, session.id, counts["exec"], counts["exec_warmup"]))
            progress(f"diagnostics: agent Health and Exec without the public hop x{counts['diag']}")
            health, direct = await bench_agent_direct(warm, session.sandbox_id, counts["diag"], counts["exec_warmup"])
            rows["agent_health"] = Row("diag: agent Health (unary, no exec)", health)
            rows["agent_exec"] = Row("diag: agent Exec true (no public hop)", direct)
            progress(f"docker exec x{counts['docker_exec']}")
            rows["docker_exec"] = Row("baseline: docker exec (CLI)", await bench_docker_exec(
                container_id, counts["docker_exec"]))
            progress(f"docker-py exec_run x{counts['dockerpy_exec']}")
            rows["dockerpy_exec"] = Row("baseline: docker-py exec_run", await bench_dockerpy_exec(
                container_id, counts["dockerpy_exec"]))
        finally:
            await warm.client.delete_session(session.id)

        progress(f"stopping {warm_instance}; starting control plane {cold_instance} (pool size 0)")
        planes.remove(warm)
        await stop_plane(warm)
        cold = await start_plane(cold_instance, 0)
        planes.append(cold)
        data_dirs.append(cold.data_dir)
        progress(f"session create (cold) x{counts['cold']}")
        samples, _ = await bench_create(cold, counts["cold"], warm=False)
        rows["cold"] = Row("session create (cold)", samples)
        planes.remove(cold)
        await stop_plane(cold)

        progress(f"docker run --rm x{counts['docker_run']}")
        rows["docker_run"] = Row("baseline: docker run --rm true", await bench_docker_run(
            f"ocsb.instance={base_instance}", counts["docker_run"]))
    except Exception as exc:
        notes.append(f"benchmark aborted: {exc!r}")
        logging.getLogger(__name__).exception("benchmark aborted")
    finally:
        await cleanup(instances, planes, data_dirs, notes)
    for message, count in asyncio_errors.counts.items():
        hidden = "" if args.verbose else "; hidden, -v shows them"
        notes.append(f"asyncio logged {count}x: {message!r} (tasks/generators left behind by calls{hidden})")
    print(f"\n{env}; control planes in-process on 127.0.0.1, pool size {POOL_SIZE} (warm) / 0 (cold)")
    order = ["warm", "cold", "exec", "docker_run", "docker_exec", "dockerpy_exec", "agent_health", "agent_exec"]
    print_report({k: rows[k] for k in order if k in rows}, notes)
    print(f"\ntotal wall time {time.perf_counter() - wall:.1f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"about {QUICK_FACTOR:g}x the default samples")
    parser.add_argument("--samples-scale", type=float, default=1.0, help="multiply every sample count")
    parser.add_argument("-v", "--verbose", action="store_true", help="control plane logs at INFO, asyncio errors shown")
    args = parser.parse_args()
    if args.samples_scale <= 0:
        parser.error("--samples-scale must be positive")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio_errors = AsyncioErrorCounter(show=args.verbose)
    logging.getLogger("asyncio").addFilter(asyncio_errors)
    try:
        asyncio.run(run(args, asyncio_errors))
    except Exception:
        logging.getLogger(__name__).exception("benchmark failed")
    return 0  # benchmarks report, they do not gate


if __name__ == "__main__":
    sys.exit(main())
