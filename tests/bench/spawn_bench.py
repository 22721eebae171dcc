"""Round trip of `/bin/true` as another uid: the spawner helper vs Popen's own uid switch.

Run on the host as root: `PYTHONPATH=sandbox-image .venv/bin/python tests/bench/spawn_bench.py`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import time

from sandbox_agent import spawner
from sandbox_agent.process import ExecSpec, Execution, Exit, Identity

ITERATIONS = 300
WARMUP = 20
SPEC = ExecSpec(argv=["/bin/true"], env={"PATH": "/usr/bin:/bin"}, cwd="/tmp", timeout_s=None, stdin=False,
                kill_grace_s=0.2, merge_stderr=False)


async def one(identity: Identity) -> float:
    started = time.perf_counter()
    execution = await Execution.start(SPEC, identity, 1 << 20)
    async for item in execution.events():
        if isinstance(item, Exit) and item.exit_code != 0:
            raise SystemExit(f"/bin/true failed: {item}")
    return (time.perf_counter() - started) * 1000


async def measure(identity: Identity) -> list[float]:
    for _ in range(WARMUP):
        await one(identity)
    return [await one(identity) for _ in range(ITERATIONS)]


def report(name: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(f"{name:<34} p50 {p50:6.3f} ms   p99 {p99:6.3f} ms   (n={len(ordered)})")


async def main() -> None:
    if os.getuid() != 0:
        raise SystemExit("run as root: both paths switch to uid 65534")
    # The venv's interpreter may sit under a directory the tool uid cannot enter.
    spawner.PYTHON = os.environ.get("SPAWNER_PYTHON") or shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    print(f"python {sys.version.split()[0]}, helper interpreter {spawner.PYTHON}, {ITERATIONS} runs after {WARMUP}")
    report("spawner (uid 65534)", await measure(Identity(65534, 65534)))
    report("Popen user= (uid 65534, old path)", await measure(Identity(65534, 65534, via_spawner=False)))
    report("Popen, no uid switch", await measure(Identity(None, None)))
    await Execution.close_spawners()


if __name__ == "__main__":
    asyncio.run(main())
