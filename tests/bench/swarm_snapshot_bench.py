"""Snapshot, restore and fork of a 100 MiB workspace on the two-node swarm, its sandboxes on the worker: the tar
crosses the relay (mutual TLS over the veth pair) instead of a local Unix socket. The same workspace and calls as
tests.bench.snapshot_bench, whose single-host figures are the comparison (docs/snapshots.md).

Usage: ``.venv/bin/python -m tests.bench.swarm_snapshot_bench [--quick]``; also printed by the cluster section
(``make bench-cluster``). Skipped when no cluster is up.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from sandbox_agent import event_loop
from tests.bench.bench_common import Row
from tests.bench.snapshot_bench import MAKE_TREE
from tests.cluster.support import running_cluster, swarm_plane


async def section(quick: bool) -> list[str]:
    cluster, why = await asyncio.to_thread(running_cluster)
    if cluster is None:
        return [f"  skipped: {why}"]
    samples = 1 if quick else 3
    rows = {k: Row(k, []) for k in ("snapshot", "restore", "fork")}
    stored = 0
    async with swarm_plane() as p:
        beta = p.clients["beta"]  # placed on the worker
        source = await beta.create_session()
        made = await beta.run(source.id, ["python3", "-c", MAKE_TREE, "/workspace/tree"])
        if made.exit_code != 0:
            return [f"  making the workspace failed: {made.stderr.decode()[-400:]}"]
        for _ in range(samples):
            start = time.perf_counter()
            snap = await beta.snapshot(source.id)
            rows["snapshot"].samples_ms.append((time.perf_counter() - start) * 1000)
            stored = snap.size_bytes
            start = time.perf_counter()
            restored = await beta.create_session(from_snapshot=snap.id, deadline_s=600)
            rows["restore"].samples_ms.append((time.perf_counter() - start) * 1000)
            await beta.delete_session(restored.id)
            await beta.delete_snapshot(snap.id)
            start = time.perf_counter()
            fork = await beta.fork(source.id)
            rows["fork"].samples_ms.append((time.perf_counter() - start) * 1000)
            await beta.delete_session(fork.id)
    lines = [f"  swarm, sandboxes on the worker: 100 MiB workspace (stored {stored / (1 << 20):.1f} MiB), "
             f"{samples} samples, cold sandboxes (no pool) (p50 / max ms)"]
    lines += [f"    {name:10} {row.p50:9.0f} / {max(row.samples_ms):.0f}" for name, row in rows.items()]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for line in event_loop.run(section(args.quick)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
