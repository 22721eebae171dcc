"""Sessions on the two-node swarm of `make cluster-up` beside the single-host Docker provider, one run.

Rows (wall clock seen by the public-API client; control planes in this process on loopback):

* ``session acquire, cold`` -- ``create_session()`` that starts a new sandbox and waits for its agent. On the
  cluster it is pinned to one node through the tenants' node-label constraints (which also bypass the warm
  pool): a one-replica service, its ``--internal`` overlay, the task's start, the relay's socket dirs and the
  agent's first answer over the relay. Single host: ``pids`` one below the default, so the pool is bypassed
  too. Each session is deleted (untimed) before the next sample.
* ``session acquire, warm pool`` -- the same call while the pool is full (a tenant without constraints); the
  pool is refilled (untimed) before every sample, so each one is a hit.
* ``tool bash echo`` / ``tool read`` -- ``execute_tool`` in one READY session on the worker node (the remote
  node: another dockerd, reached over a veth pair and its relay) and one on the manager (the control plane's
  own engine, but still through its relay), beside the same calls through the single-host provider.

Both nodes are on this machine: "remote" is another network namespace and daemon, not another computer, so
the remote/local ratio shows what the relay path and the worker add, not a physical network's latency.
Targets (DESIGN §10, applied to the cluster): warm acquire p50 <= 30 ms; tool call p50 <= 3 ms on either node.
The section never brings the cluster up (so `make bench` stays single-host): `make bench-cluster` does.
Run alone: ``.venv/bin/python -m tests.bench.cluster_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Awaitable
from typing import Any

from controlplane.client import AsyncClient
from controlplane.config import ResourcesConfig
from controlplane.core.seam.provider import SandboxProvider
from sandbox_agent import event_loop
from tests.bench import swarm_snapshot_bench
from tests.bench.bench_common import Row
from tests.cluster.support import Cluster, running_cluster, swarm_plane
from tests.planes import running_plane

WARM_TARGET_MS = 30.0
TOOL_TARGET_MS = 3.0
POOL_SIZE = 2
STEP_TIMEOUT_S = 120.0
"""A stuck step fails the section instead of hanging it."""
BENCH_FILE = "/workspace/bench.txt"
BENCH_TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 6))
READ_OUTPUT = (
    f"<path>{BENCH_FILE}</path>\n<type>file</type>\n<content>"
    + "".join(f"{i}: line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 6))
    + "\n(End of file - total 5 lines)\n</content>"
)
ECHO = {"command": "echo hi", "description": "Echo"}
TARGET_NAMES = {"host": "single host", "local": "manager (local node)", "remote": "worker (remote node)"}
SAMPLES = {"cold": 6, "warm": 15, "tool": 100, "warmup": 10}
QUICK = {"cold": 3, "warm": 5, "tool": 30, "warmup": 5}


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


async def timed(work: Awaitable[object]) -> float:
    started = time.perf_counter()
    await asyncio.wait_for(work, STEP_TIMEOUT_S)
    return (time.perf_counter() - started) * 1000.0


async def wait_pool_full(provider: SandboxProvider) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        stats = provider.pool_stats()
        if stats.ready >= stats.target and stats.creating == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool did not refill within {STEP_TIMEOUT_S:g} s: {stats}")
        await asyncio.sleep(0.02)


async def acquire_samples(
    client: AsyncClient, n: int, provider: SandboxProvider, warm: bool, **resources: Any
) -> list[float]:
    """Create (timed) and delete (untimed) `n` sessions; warm samples must all be pool hits."""
    samples = []
    for _ in range(n):
        if warm:
            await wait_pool_full(provider)
        hits = provider.pool_stats().hits
        started = time.perf_counter()
        session = await asyncio.wait_for(client.create_session(**resources), STEP_TIMEOUT_S)
        samples.append((time.perf_counter() - started) * 1000.0)
        if provider.pool_stats().hits != hits + (1 if warm else 0):
            raise RuntimeError(f"a {'warm' if warm else 'cold'} sample was {'not ' if warm else ''}a pool hit")
        await asyncio.wait_for(client.delete_session(session.id), STEP_TIMEOUT_S)
    return samples


async def tool_call(client: AsyncClient, session_id: str, tool: str, args: dict[str, Any], expect: str) -> None:
    outcome = await client.execute_tool(session_id, tool, args)
    if outcome.error is not None or outcome.output != expect:
        raise RuntimeError(f"{tool}: error={outcome.error!r} output={outcome.output!r}")


async def tool_rows(targets: dict[str, tuple[AsyncClient, str]], counts: dict[str, int]) -> dict[str, Row]:
    """Interleaved calls (one per target in turn), so that load changing on the machine hits every target alike."""
    for where, (client, session_id) in targets.items():
        made = await client.run(session_id, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", BENCH_TEXT, BENCH_FILE])
        if made.exit_code != 0:
            raise RuntimeError(f"writing {BENCH_FILE} on {where} exited {made.exit_code}: {made.stderr!r}")
    rows: dict[str, Row] = {}
    for tool, args, expect in (("bash", ECHO, "hi\n"), ("read", {"filePath": BENCH_FILE}, READ_OUTPUT)):
        progress(f"tool {tool} x{counts['tool']} on each of {', '.join(targets)}")
        samples: dict[str, list[float]] = {where: [] for where in targets}
        for i in range(counts["warmup"] + counts["tool"]):
            for where, (client, session_id) in targets.items():
                elapsed = await timed(tool_call(client, session_id, tool, args, expect))
                if i >= counts["warmup"]:
                    samples[where].append(elapsed)
        for where, values in samples.items():
            rows[f"{where}_{tool}"] = Row(f"tool {'bash echo' if tool == 'bash' else 'read'}, {TARGET_NAMES[where]}",
                                          values)
    return rows


async def measure(cluster: Cluster, counts: dict[str, int]) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    off_pool = ResourcesConfig().pids - 1
    async with running_plane("docker", pool={"size": POOL_SIZE}) as host, swarm_plane(pool_size=POOL_SIZE) as swarm:
        host_provider, swarm_provider = host.plane.sessions._provider, swarm.plane.sessions._provider
        await asyncio.gather(wait_pool_full(host_provider), wait_pool_full(swarm_provider))
        progress(f"single host: cold acquire x{counts['cold']}, warm x{counts['warm']}")
        rows["host_cold"] = Row("single host: acquire, cold", await acquire_samples(
            host.client, counts["cold"], host_provider, warm=False, pids=off_pool))
        rows["host_warm"] = Row("single host: acquire, warm pool", await acquire_samples(
            host.client, counts["warm"], host_provider, warm=True))
        for tenant, node in (("alpha", "manager"), ("beta", "worker")):
            progress(f"cluster: cold acquire on the {node} x{counts['cold']}")
            rows[f"cold_{node}"] = Row(f"cluster: acquire, cold, {node}", await acquire_samples(
                swarm.clients[tenant], counts["cold"], swarm_provider, warm=False))
        rows["cold"] = Row("cluster: acquire, cold, both nodes",
                           rows["cold_manager"].samples_ms + rows["cold_worker"].samples_ms)
        progress(f"cluster: warm acquire x{counts['warm']}")
        rows["warm"] = Row("cluster: acquire, warm pool", await acquire_samples(
            swarm.clients["gamma"], counts["warm"], swarm_provider, warm=True))
        await asyncio.gather(wait_pool_full(host_provider), wait_pool_full(swarm_provider))
        on_host = await host.client.create_session()
        on_manager = await swarm.clients["alpha"].create_session()
        on_worker = await swarm.clients["beta"].create_session()
        node_of = getattr(swarm_provider, "node_of")  # noqa: B009 - the Swarm provider's own accessor
        if (node_of(on_manager.sandbox_id), node_of(on_worker.sandbox_id)) != (cluster.manager, cluster.worker):
            raise RuntimeError("the sessions were not placed on the nodes their tenants are pinned to")
        rows |= await tool_rows({
            "host": (host.client, on_host.id), "local": (swarm.clients["alpha"], on_manager.id),
            "remote": (swarm.clients["beta"], on_worker.id),
        }, counts)
    return rows


def ratio(numerator: Row | None, denominator: Row | None) -> str:
    if numerator is None or denominator is None or not numerator.samples_ms or not denominator.samples_ms:
        return "n/a"
    return f"{numerator.p50 / denominator.p50:.2f}x"


def target(label: str, row: Row | None, limit_ms: float) -> str:
    if row is None or not row.samples_ms:
        return f"  FAIL  {label}: not measured"
    return f"  {'PASS' if row.p50 <= limit_ms else 'FAIL'}  {label} p50 {row.p50:.2f} ms <= {limit_ms:g} ms"


def report(rows: dict[str, Row], notes: list[str]) -> list[str]:
    header = f"  {'measurement':<44} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'min ms':>9} {'max ms':>9}"
    lines = [header, "  " + "-" * (len(header) - 2)]
    order = ["cold_manager", "cold_worker", "cold", "host_cold", "warm", "host_warm", "local_bash", "remote_bash",
             "host_bash", "local_read", "remote_read", "host_read"]
    for key in order:
        row = rows.get(key)
        if row is not None and row.samples_ms:
            s = row.samples_ms
            cells = " ".join(f"{v:>9.2f}" for v in (row.p50, row.p99, min(s), max(s)))
            lines.append(f"  {row.name:<44} {len(s):>4} {cells}")
    get = rows.get
    lines += [
        "  ratios (p50 / p50):",
        f"    cold acquire, cluster / single host        : {ratio(get('cold'), get('host_cold'))}",
        f"    cold acquire, worker / manager             : {ratio(get('cold_worker'), get('cold_manager'))}",
        f"    warm acquire, cluster / single host        : {ratio(get('warm'), get('host_warm'))}",
        f"    bash echo, remote node / local node        : {ratio(get('remote_bash'), get('local_bash'))}",
        f"    read,      remote node / local node        : {ratio(get('remote_read'), get('local_read'))}",
        f"    bash echo, local node (relay) / single host: {ratio(get('local_bash'), get('host_bash'))}",
        f"    read,      local node (relay) / single host: {ratio(get('local_read'), get('host_read'))}",
        "  targets:",
        target("cluster warm acquire", get("warm"), WARM_TARGET_MS),
        target("tool bash echo on the remote node", get("remote_bash"), TOOL_TARGET_MS),
        target("tool read on the remote node", get("remote_read"), TOOL_TARGET_MS),
        target("tool bash echo on the local node", get("local_bash"), TOOL_TARGET_MS),
    ]
    lines += [f"  note: {note}" for note in notes]
    return lines


async def section(quick: bool) -> list[str]:
    cluster, why = await asyncio.to_thread(running_cluster)
    if cluster is None:
        return [f"  skipped: {why}"]
    counts = QUICK if quick else SAMPLES
    rows: dict[str, Row] = {}
    notes = [f"two nodes on one machine (worker {cluster.state.get('WORKER_ADDR')} in netns "
             f"{cluster.state.get('NETNS')}); pool size {POOL_SIZE}; cold samples are deleted between samples"]
    try:
        rows = await measure(cluster, counts)
    except Exception as exc:
        logging.getLogger(__name__).exception("cluster section failed")
        notes.append(f"failed: {exc!r}")
    lines = report(rows, notes)
    try:
        lines += await swarm_snapshot_bench.section(quick)
    except Exception as exc:
        logging.getLogger(__name__).exception("cluster snapshot rows failed")
        lines.append(f"  snapshots on the swarm failed: {exc!r}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    wall = time.perf_counter()
    for line in event_loop.run(section(args.quick)):
        print(line, flush=True)
    print(f"  (section wall time {time.perf_counter() - wall:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
