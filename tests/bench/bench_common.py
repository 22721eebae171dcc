"""What `make bench`'s modules (bench.py and the bench_* modules beside it) share: the design's targets, sample
counts, a row of samples with its percentiles, timing, and the progress line."""

from __future__ import annotations

import logging
import math
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

IMAGE = "ocsb-sandbox:latest"
WARM_TARGET_MS = 30.0
EXEC_TARGET_MS = 3.0
EXEC_MIN_SPEEDUP = 20.0
TOOL_TARGET_MS = 3.0
PERMISSION_OVERHEAD_TARGET_MS = 1.0
RULED_CONFIG = {"permission": {
    "bash": {"*": "ask", **{f"tool{i} *": "deny" for i in range(60)}, "echo *": "allow"},
    "read": {"*": "allow", **{f"*.secret{i}": "deny" for i in range(20)}},
}}
TOOL_MIN_SPEEDUP = 20.0
ABORT_TARGET_MS = 100.0
ABORT_POLL_S = 0.002
ABORT_STEP_TIMEOUT_S = 30.0
POOL_SIZE = 2
POOL_REFILL_TIMEOUT_S = 60.0
BENCH_FILE = "/workspace/bench.txt"
BENCH_TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 6))

DEFAULT_SAMPLES = {
    "warm": 30,
    "cold": 10,
    "exec": 300,
    "exec_warmup": 20,
    "docker_run": 10,
    "docker_exec": 30,
    "dockerpy_exec": 30,
    "diag": 100,
    "tool_read": 200,
    "tool_bash": 100,
    "tool_bash_rules": 100,
    "permission_eval": 20000,
    "permission_gate": 2000,
    "tool_warmup": 10,
    "docker_cat": 30,
    "docker_echo": 30,
    "local_read": 200,
    "abort": 20,
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


SCRATCH: list[Path] = []
"""Scratch dirs this bench process made; bench.py removes them at the end, also after a failure."""


def scratch_dir(prefix: str) -> Path:
    """A new dir under /tmp, removed (with any loop device of a disk image in it) when the bench ends."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    SCRATCH.append(path)
    return path


THREADS_CPU = '''
def threads_cpu(pid):
    # schedstat's first field is the task's CPU time in ns; summed over the process's threads.
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9
'''
"""The source of `threads_cpu(pid)` for the child-process scripts of the CPU benches (they need `import os`): a
server's CPU read from outside it, its threads included."""
