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
* ``tool read (small file)`` -- ``AsyncClient.execute_tool(session, "read", ...)`` of a five-line file in the
  same session (client -> control plane ExecuteTool -> agent RunTool -> result), beside ``docker exec <cid> cat``
  of that file via the CLI and an in-process ``open().read()`` of a local temp file.
* ``tool bash echo`` -- ``execute_tool(session, "bash", {"command": "echo hi", ...})`` beside
  ``docker exec <cid> echo hi``.
* ``abort -> all processes gone`` -- a raw ``tool_call`` of bash running two background ``sleep``s; once its
  live metadata shows "ready" an ``AbortCall`` is sent (t0) and the agent is polled directly with
  ``pgrep -f`` (about every 2 ms) until no process of the call is left. ``abort -> result event`` is when the
  call's final event arrived, from the same t0.

The control planes run in this process (``controlplane.app.start``) on 127.0.0.1 with an ephemeral port
and their own instance labels; every container they or the baselines start is removed at the end and the
engine is checked for leftovers. Targets from the design: warm acquire p50 <= 30 ms; exec round trip, tool
read and tool bash p50 <= 3 ms and at least 20x faster than the matching ``docker exec``; abort leaves no
process of the call alive within 100 ms (p50). The script reports PASS/FAIL but always exits 0.

Usage: ``.venv/bin/python tests/bench/bench.py [--quick] [--samples-scale F]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import json
import logging
import math
import os
import secrets
import shutil
import subprocess
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
from controlplane.core.calls.tool import PermissionAsk
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import AskScope, PermissionGate
from controlplane.core.seam.messages import CommandSpec, Exited
from controlplane.core.seam.provider import Sandbox
from controlplane.store.sqlite import AuditWriter, SqliteStore
from controlplane.v1 import tool_pb2
from sandbox_agent import event_loop
from sandbox_agent.gc_tuning import tune_after_startup

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


# -- docker CLI ------------------------------------------------------------------------------------


async def docker_cli(*args: str, check: bool = True) -> str:
    # subprocess.run starts the CLI with vfork; uvloop's subprocesses fork the whole bench process, which
    # would slow the baselines down (and flatter the ratios against them).
    done = await asyncio.to_thread(subprocess.run, ["docker", *args], capture_output=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({done.returncode}): "
                           f"{done.stderr.decode(errors='replace')}")
    return done.stdout.decode()


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


async def bench_tool(client: AsyncClient, session_id: str, tool: str, args: dict[str, Any], expect: str,
                     n: int, warmup: int) -> tuple[list[float], int]:
    """Times whole `execute_tool` calls; returns samples and how many permission requests were answered.

    Each call has its own message id, as each step of a model's turn does: the same call repeated within one
    message is a doom loop, which asks the user from the third time on (that path is the toolpath section's).
    """
    asks = 0
    messages = itertools.count(1)

    async def once() -> None:
        nonlocal asks
        outcome = await client.execute_tool(session_id, tool, args, message_id=f"bench-{next(messages)}")
        if outcome.error is not None or expect not in outcome.output:
            raise RuntimeError(f"{tool} tool call went wrong: error={outcome.error!r} result={outcome.result!r}")
        asks += len(outcome.permission_requests)

    for _ in range(warmup):
        await once()
    asks = 0
    return [await timed(once) for _ in range(n)], asks


async def bench_permission(n_eval: int, n_gate: int) -> tuple[list[float], list[float]]:
    """Rule evaluation and a whole allowed ask (rules, approvals, operator policy, audit enqueue)."""
    home = "/tmp/home"
    user = permission.from_config(RULED_CONFIG["permission"], home=home)
    agent = permission.builtin_agents(f"{home}/t", [], f"{home}/p", user, home=home)["build"]
    evaluate = []
    for _ in range(n_eval):
        started = time.perf_counter()
        permission.evaluate("bash", "echo hi", agent.permission)
        evaluate.append((time.perf_counter() - started) * 1000)
    samples = []
    with tempfile.TemporaryDirectory(prefix="ocsb-bench") as tmp:
        store = SqliteStore(Path(tmp) / "audit.db")
        audit = AuditWriter(store)
        gate = PermissionGate(audit=audit)
        scope = AskScope("bench", "ses_bench", "call", "msg", "bash", agent.permission, [])
        ask = PermissionAsk("bash", ["echo hi"], ["echo *"], {})
        for _ in range(n_gate):
            started = time.perf_counter()
            await gate.ask(ask, scope, lambda _: None)
            samples.append((time.perf_counter() - started) * 1000)
        await audit.close()
        store.close()
    return evaluate, samples


async def bench_local_read(path: Path, n: int) -> list[float]:
    """The floor for reading a small file: an in-process read, timed like every other row."""
    def read() -> None:
        with open(path, encoding="utf-8") as f:
            if f.read() != BENCH_TEXT:
                raise RuntimeError("local read returned other content")

    async def once() -> None:
        read()  # blocking on purpose: the baseline is a plain read on the caller's thread

    await once()
    return [await timed(once) for _ in range(n)]


async def bench_docker_cli_exec(container_id: str, argv: list[str], expect: str, n: int) -> list[float]:
    async def once() -> None:
        out = await docker_cli("exec", container_id, *argv)
        if out != expect:
            raise RuntimeError(f"docker exec {argv} printed {out!r}")

    await once()  # warm-up
    return [await timed(once) for _ in range(n)]


async def agent_pgrep(sandbox: Sandbox, pattern: str) -> int:
    """pgrep's exit code inside the sandbox: 0 = a process matches, 1 = none."""
    stream = await sandbox.agent.exec(CommandSpec(argv=["pgrep", "-f", pattern]))
    code: int | None = None
    async for event in stream.events():
        if isinstance(event, Exited):
            code = event.exit_code
    if code is None or code not in (0, 1):
        raise RuntimeError(f"pgrep -f {pattern!r} in the sandbox ended with {code}")
    return code


async def abort_once(client: AsyncClient, sandbox: Sandbox, session_id: str, index: int) -> tuple[float, float]:
    """One abort sample: (ms until no process of the call is left, ms until the call's final event)."""
    # Sleep durations unique to the sample, so a straggler from an earlier sample cannot be mistaken for this one.
    first, second = 600 + 2 * index, 601 + 2 * index
    pattern = f"sleep ({first}|{second})( |$)"  # also matches the `bash -c` parent, whose argv holds the script
    command = f"sleep {first} & sleep {second} & echo ready; wait"
    stream, outbox = client.tool_call(session_id, "bash", {"command": command, "description": "Hang"},
                                      call_id=f"bench-abort-{index}-{secrets.token_hex(4)}")
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    final: list[tuple[float, str]] = []

    async def read() -> None:
        async for event in stream:
            kind = event.WhichOneof("event")
            if kind == "metadata" and "ready" in event.metadata.metadata_json and not ready.done():
                ready.set_result(None)
            elif kind == "permission_request":
                reply = tool_pb2.PermissionReply(request_id=event.permission_request.id,
                                                 reply=tool_pb2.PermissionReply.ONCE)
                outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=reply))
            elif kind in ("result", "error"):
                final.append((time.perf_counter(), kind))
                return
        raise RuntimeError("the tool call's stream ended without a result or an error")

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait({ready, reader}, timeout=ABORT_STEP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            if reader.done():
                reader.result()  # raises the reader's error
                raise RuntimeError(f"the hanging bash call ended before printing ready: {final}")
            raise RuntimeError(f"no 'ready' metadata within {ABORT_STEP_TIMEOUT_S:g} s")
        if await agent_pgrep(sandbox, pattern) != 0:
            raise RuntimeError("pgrep in the sandbox does not see the call's sleep processes")
        t0 = time.perf_counter()
        outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="bench")))
        while await agent_pgrep(sandbox, pattern) == 0:
            # The time is taken after the pgrep that saw none, so poll latency only ever adds to the sample.
            if time.perf_counter() - t0 > ABORT_STEP_TIMEOUT_S:
                raise RuntimeError(f"processes of the aborted call still alive after {ABORT_STEP_TIMEOUT_S:g} s")
            await asyncio.sleep(ABORT_POLL_S)
        gone_ms = (time.perf_counter() - t0) * 1000.0
        await asyncio.wait_for(reader, ABORT_STEP_TIMEOUT_S)
        return gone_ms, (final[0][0] - t0) * 1000.0
    finally:
        outbox.put_nowait(None)
        stream.cancel()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader


async def bench_abort(p: Plane, session_id: str, sandbox_id: str, n: int) -> tuple[list[float], list[float]]:
    sandbox = await p.plane.sessions._provider.get(sandbox_id)
    gone: list[float] = []
    result: list[float] = []
    for i in range(n):
        gone_ms, result_ms = await abort_once(p.client, sandbox, session_id, i)
        gone.append(gone_ms)
        result.append(result_ms)
    return gone, result


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
    tool_read, tool_bash = rows.get("tool_read"), rows.get("tool_bash")
    docker_cat, docker_echo, local_read = rows.get("docker_cat"), rows.get("docker_echo"), rows.get("local_read")
    print(f"  tool read    vs docker exec cat     : {speedup(docker_cat, tool_read)}")
    print(f"  tool read    vs python open().read(): {speedup(local_read, tool_read)}")
    print(f"  tool bash    vs docker exec echo    : {speedup(docker_echo, tool_bash)}")

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
    print_tool_target("tool read (small file)", tool_read, docker_cat, "docker exec cat")
    print_tool_target("tool bash echo", tool_bash, docker_echo, "docker exec echo")
    ruled, gate = rows.get("tool_bash_rules"), rows.get("permission_gate")
    if ruled is not None and ruled.samples_ms and tool_bash is not None and tool_bash.samples_ms:
        print(f"  info  80-rule project vs default rules, bash echo p50: {ruled.p50 - tool_bash.p50:+.2f} ms "
              "(two sessions, noisy)")
    if gate is not None and gate.samples_ms:
        ok = gate.p99 <= PERMISSION_OVERHEAD_TARGET_MS
        print(f"  {'PASS' if ok else 'FAIL'}  permission overhead of an allowed call p99 {gate.p99:.3f} ms "
              f"<= {PERMISSION_OVERHEAD_TARGET_MS:g} ms")
    else:
        print("  FAIL  permission overhead: not measured")
    abort_gone = rows.get("abort_gone")
    if abort_gone is not None and abort_gone.samples_ms:
        ok = abort_gone.p50 <= ABORT_TARGET_MS
        print(f"  {'PASS' if ok else 'FAIL'}  abort -> all processes gone p50 {abort_gone.p50:.2f} ms "
              f"<= {ABORT_TARGET_MS:g} ms")
    else:
        print("  FAIL  abort -> all processes gone: not measured")
    if notes:
        print()
        print("notes:")
        for note in notes:
            print(f"  - {note}")


def print_tool_target(label: str, row: Row | None, baseline: Row | None, baseline_label: str) -> None:
    if row is None or not row.samples_ms or baseline is None or not baseline.samples_ms:
        print(f"  FAIL  {label}: not measured")
        return
    ratio = baseline.p50 / row.p50
    ok = row.p50 <= TOOL_TARGET_MS and ratio >= TOOL_MIN_SPEEDUP
    print(
        f"  {'PASS' if ok else 'FAIL'}  {label} p50 {row.p50:.2f} ms <= {TOOL_TARGET_MS:g} ms "
        f"and {ratio:.1f}x >= {TOOL_MIN_SPEEDUP:g}x faster than {baseline_label}"
    )


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


async def measure_tools(p: Plane, session_id: str, sandbox_id: str, container_id: str, counts: dict[str, int],
                        rows: dict[str, Row], notes: list[str]) -> None:
    """The tool rows and their baselines, in the READY session the exec rows used."""
    made = await p.client.run(session_id, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", BENCH_TEXT, BENCH_FILE])
    if made.exit_code != 0:
        raise RuntimeError(f"creating {BENCH_FILE} exited {made.exit_code}: {made.stderr!r}")
    progress(f"tool read x{counts['tool_read']} (+{counts['tool_warmup']} warm-up)")
    samples, asks = await bench_tool(p.client, session_id, "read", {"filePath": BENCH_FILE}, "1: line 1:",
                                     counts["tool_read"], counts["tool_warmup"])
    rows["tool_read"] = Row("tool read (small file)", samples)
    if asks:
        notes.append(f"tool read: {asks} permission request(s) answered inside the timed calls")
    progress(f"docker exec cat x{counts['docker_cat']}")
    rows["docker_cat"] = Row("baseline: docker exec cat (CLI)", await bench_docker_cli_exec(
        container_id, ["cat", BENCH_FILE], BENCH_TEXT, counts["docker_cat"]))
    local = p.data_dir / "bench.txt"
    local.write_text(BENCH_TEXT, encoding="utf-8")
    progress(f"python open().read() x{counts['local_read']}")
    rows["local_read"] = Row("baseline: python open().read() local", await bench_local_read(
        local, counts["local_read"]))

    progress(f"tool bash echo x{counts['tool_bash']} (+{counts['tool_warmup']} warm-up)")
    samples, asks = await bench_tool(p.client, session_id, "bash", {"command": "echo hi", "description": "Echo"},
                                     "hi", counts["tool_bash"], counts["tool_warmup"])
    rows["tool_bash"] = Row("tool bash echo", samples)
    if asks:
        notes.append(f"tool bash: {asks} permission request(s) answered inside the timed calls")
    progress(f"tool bash echo with 80 project rules x{counts['tool_bash_rules']}")
    ruled = await p.client.create_session(config_json=json.dumps(RULED_CONFIG))
    samples, asks = await bench_tool(p.client, ruled.id, "bash", {"command": "echo hi", "description": "Echo"},
                                     "hi", counts["tool_bash_rules"], counts["tool_warmup"])
    rows["tool_bash_rules"] = Row("tool bash echo, allowed by rule 62/62", samples)
    await p.client.delete_session(ruled.id)
    progress(f"permission evaluate x{counts['permission_eval']}, gate ask x{counts['permission_gate']}")
    evaluate, gate = await bench_permission(counts["permission_eval"], counts["permission_gate"])
    rows["permission_eval"] = Row("diag: permission evaluate (in-process)", evaluate)
    rows["permission_gate"] = Row("diag: permission gate ask, allowed", gate)

    progress(f"docker exec echo x{counts['docker_echo']}")
    rows["docker_echo"] = Row("baseline: docker exec echo hi (CLI)", await bench_docker_cli_exec(
        container_id, ["echo", "hi"], "hi\n", counts["docker_echo"]))

    progress(f"abort -> all processes gone x{counts['abort']}")
    gone, result = await bench_abort(p, session_id, sandbox_id, counts["abort"])
    rows["abort_gone"] = Row("abort -> all processes gone", gone)
    rows["abort_result"] = Row("abort -> result event", result)


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
    tune_after_startup()  # as `controlplane serve` does once its plane is up
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
            await measure_tools(warm, session.id, session.sandbox_id, container_id, counts, rows, notes)
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
    order = ["warm", "cold", "exec", "docker_run", "docker_exec", "dockerpy_exec", "agent_health", "agent_exec",
             "tool_read", "docker_cat", "local_read", "tool_bash", "tool_bash_rules", "docker_echo",
             "permission_eval", "permission_gate", "abort_gone", "abort_result"]
    print_report({k: rows[k] for k in order if k in rows}, notes)
    await print_sections(args.quick)
    print(f"\ntotal wall time {time.perf_counter() - wall:.1f} s", flush=True)


SECTIONS = (
    ("custom tools", "tests.bench.custom_tools_bench"),
    ("tracing overhead", "tests.bench.tracing_bench"),
    ("bash permission analysis", "tests.bench.bash_rules_bench"),
    ("under attack", "tests.bench.attack_bench"),
    ("tool-call path", "tests.bench.toolpath_bench"),
    ("floors", "tests.bench.floor_bench"),
    ("grpc engine", "tests.bench.grpc_engine_bench"),
    ("gVisor beside runc", "tests.bench.gvisor_bench"),
)
"""`make bench` then runs the cluster's section (tests.bench.cluster_bench) with a two-node swarm it brings up."""
"""Benchmarks of their own modules (each starts and removes its own control plane), run after the core rows."""


async def print_sections(quick: bool) -> None:
    for title, module in SECTIONS:
        progress(f"section: {title}")
        print(f"\n== {title} ==", flush=True)
        try:
            section = importlib.import_module(module).section
            for line in await section(quick):
                print(line, flush=True)
        except Exception as exc:  # one broken section must not hide the others' figures
            logging.getLogger(__name__).exception("section %s failed", title)
            print(f"section failed: {exc!r}", flush=True)


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
        event_loop.run(run(args, asyncio_errors))  # the loop `controlplane serve` runs on
    except Exception:
        logging.getLogger(__name__).exception("benchmark failed")
    return 0  # benchmarks report, they do not gate


if __name__ == "__main__":
    sys.exit(main())
