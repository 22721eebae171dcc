"""Where a cold CreateSession's time goes, beside `docker run --rm` of the same image in alternation.

Rows (wall clock, in-process control plane on loopback with pool size 0, so every create starts a container):

* ``session create (cold)`` -- ``create_session()`` through the public API, then the session is deleted
  (untimed); each sample is followed by one ``docker run --rm --network none --entrypoint true IMAGE``
  (``baseline``), so that load from elsewhere on the machine touches both alike.
* ``phase:`` rows -- the same creates split by timing the provider's own steps on the way through (the real
  functions run; only a clock is read around them): the workspace volume (with its disk image), the engine's
  create and start calls, the wait for the agent's socket and its first health answer, the check of the
  agent's syscall filter, and the code snapshot RPC that CreateSession makes before it answers.

Target (issue: cold create close to the engine): cold create p50 <= 1.3x `docker run --rm` p50.
Run alone: ``.venv/bin/python -m tests.bench.cold_create_bench [--quick]``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker.models.containers

from controlplane.sandbox import agent_client, confinement
from controlplane.sandbox import docker as docker_provider
from tests.bench.bench_plane import run_alone
from tests.bench.custom_tools_bench import Row
from tests.planes import running_plane

TARGET_RATIO = 1.3
DEFAULT_IMAGE = "ocsb-sandbox:latest"
PHASES = (
    (docker_provider, "engine_uids", "phase: list the engine's uid blocks"),
    (docker_provider, "create_volume", "phase: workspace volume (disk image)"),
    (confinement, "create_container", "phase: engine create (hardened)"),
    (docker.models.containers.Container, "start", "phase: engine start"),
    (docker_provider.DockerSandboxProvider, "_wait_ready", "phase: agent socket + first health"),
    (confinement, "verify_agent_filter", "phase: agent syscall filter check"),
    (agent_client.GrpcSandboxAgent, "snapshot_code", "phase: code snapshot RPC"),
)


@contextlib.contextmanager
def timed_phases(samples: dict[str, list[float]]) -> Iterator[None]:
    """Reads the clock around each phase's real function while the block runs; puts the originals back."""
    originals: list[tuple[Any, str, Any]] = []
    for owner, name, label in PHASES:
        original = getattr(owner, name)
        originals.append((owner, name, original))
        setattr(owner, name, _clocked(original, samples[label]))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def _clocked(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def clocked_async(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                into.append((time.perf_counter() - started) * 1000)
        return clocked_async

    @functools.wraps(fn)
    def clocked(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append((time.perf_counter() - started) * 1000)
    return clocked


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def docker_run(image: str) -> float:
    argv = ["docker", "run", "--rm", "--network", "none", "--label", "ocsb.bench=cold-create", "--entrypoint", "true",
            image]
    started = time.perf_counter()
    await asyncio.to_thread(subprocess.run, argv, check=True, capture_output=True)
    return (time.perf_counter() - started) * 1000


async def measure(quick: bool) -> tuple[dict[str, Row], list[str]]:
    n = 4 if quick else 12
    image = os.environ.get("OCSB_TEST_IMAGE", DEFAULT_IMAGE)
    phases: dict[str, list[float]] = collections.defaultdict(list)
    cold: list[float] = []
    runs: list[float] = []
    loads: list[str] = []
    async with running_plane("docker", pool={"size": 0}) as plane:
        warmup = await plane.client.create_session()
        await plane.client.delete_session(warmup.id)
        await docker_run(image)
        with timed_phases(phases):
            for _ in range(n):
                loads.append(load())
                started = time.perf_counter()
                session = await plane.client.create_session()
                cold.append((time.perf_counter() - started) * 1000)
                await plane.client.delete_session(session.id)
                runs.append(await docker_run(image))
    rows = {"cold": Row("session create (cold)", cold), "run": Row("baseline: docker run --rm (true)", runs)}
    for _, _, label in PHASES:
        rows[label] = Row(label, phases[label])
    return rows, loads


def report(rows: dict[str, Row], loads: list[str]) -> list[str]:
    header = f"  {'measurement':<50} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'min ms':>9} {'max ms':>9}"
    lines = ["cold create (pool size 0) beside docker run --rm, alternating", header, "  " + "-" * (len(header) - 2)]
    lines += [row.line() for row in rows.values()]
    cold, run = rows["cold"], rows["run"]
    ratio = cold.p50 / run.p50
    engine = rows["phase: engine create (hardened)"].p50 + rows["phase: engine start"].p50
    agent = rows["phase: agent socket + first health"].p50
    lines += [
        f"  load (1/5/15 min) at each sample: {'; '.join(loads)}",
        f"  breakdown (p50s): engine create + start {engine:.0f} ms, agent start to first health {agent:.0f} ms, "
        f"volume {rows['phase: workspace volume (disk image)'].p50:.0f} ms, rest "
        f"{cold.p50 - engine - agent - rows['phase: workspace volume (disk image)'].p50:.0f} ms",
        "  targets:",
        f"    {'PASS' if ratio <= TARGET_RATIO else 'FAIL'}  cold create p50 {cold.p50:.0f} ms = {ratio:.2f}x "
        f"docker run --rm p50 {run.p50:.0f} ms (<= {TARGET_RATIO:g}x)",
    ]
    return lines


async def section(quick: bool) -> list[str]:
    rows, loads = await measure(quick)
    return report(rows, loads)


def main() -> int:
    return run_alone(section, __doc__)


if __name__ == "__main__":
    sys.exit(main())
