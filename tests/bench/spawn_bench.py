"""Round trip of `/bin/true` as another uid: the spawner helper vs Popen's own uid switch.

Run on the host as root: `PYTHONPATH=sandbox-image .venv/bin/python tests/bench/spawn_bench.py [BALLAST_MB]`.
The agent's own modules (grpc, protobuf) are imported so that a fork copies a realistically sized
process; BALLAST_MB adds touched memory on top, as a busy agent would hold.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import sys
import time

import sandbox_agent.server  # noqa: F401 - the agent's size is part of what is measured
from sandbox_agent import spawner
from sandbox_agent.process import ExecSpec, Execution, Exit, Identity

ITERATIONS = 300
WARMUP = 20
SPEC = ExecSpec(argv=["/bin/true"], env={"PATH": "/usr/bin:/bin"}, cwd="/tmp", timeout_s=None, stdin=False,
                kill_grace_s=0.2, merge_stderr=False)


async def one(identity: Identity) -> tuple[float, float]:
    """(start, start to completion) in milliseconds."""
    started = time.perf_counter()
    execution = await Execution.start(SPEC, identity, 1 << 20)
    spawned = time.perf_counter()
    async for item in execution.events():
        if isinstance(item, Exit) and item.exit_code != 0:
            raise SystemExit(f"/bin/true failed: {item}")
    return (spawned - started) * 1000, (time.perf_counter() - started) * 1000


async def measure(identity: Identity) -> list[tuple[float, float]]:
    for _ in range(WARMUP):
        await one(identity)
    return [await one(identity) for _ in range(ITERATIONS)]


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):6.3f}  p99 {p99:6.3f}"


def report(name: str, samples: list[tuple[float, float]]) -> None:
    starts, totals = [s for s, _ in samples], [t for _, t in samples]
    print(f"{name:<34} start {percentiles(starts)} ms   round trip {percentiles(totals)} ms")


async def main() -> None:
    if os.getuid() != 0:
        raise SystemExit("run as root: both paths switch to uid 65534")
    # The venv's interpreter may sit under a directory the tool uid cannot enter.
    spawner.PYTHON = os.environ.get("SPAWNER_PYTHON") or shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    ballast = bytearray(int(sys.argv[1]) * 1024 * 1024 if len(sys.argv) > 1 else 0)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"python {sys.version.split()[0]}, helper interpreter {spawner.PYTHON}, agent RSS {rss_mb} MB, "
          f"{ITERATIONS} runs after {WARMUP}")
    report("spawner (uid 65534)", await measure(Identity(65534, 65534)))
    report("Popen user= (uid 65534, old path)", await measure(Identity(65534, 65534, via_spawner=False)))
    report("Popen, no uid switch", await measure(Identity(None, None)))
    await Execution.close_spawners()


if __name__ == "__main__":
    asyncio.run(main())
