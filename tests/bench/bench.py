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
import importlib
import json
import logging
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from sandbox_agent import event_loop
from sandbox_agent.gc_tuning import tune_after_startup
from tests.bench.bench_common import (
    BENCH_FILE,
    BENCH_TEXT,
    POOL_SIZE,
    QUICK_FACTOR,
    RULED_CONFIG,
    SCRATCH,
    AsyncioErrorCounter,
    Row,
    progress,
    sample_counts,
)
from tests.bench.bench_measures import (
    bench_abort,
    bench_agent_direct,
    bench_create,
    bench_docker_cli_exec,
    bench_docker_exec,
    bench_docker_run,
    bench_dockerpy_exec,
    bench_exec,
    bench_local_read,
    bench_permission,
    bench_tool,
)
from tests.bench.bench_plane import (
    Plane,
    detach_loops,
    docker_cli,
    leftovers,
    remove_scratch,
    start_plane,
    stop_plane,
)
from tests.bench.bench_report import (
    print_report,
)


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
        # A plane stopped before deleting its sessions leaves their disk images on loop devices.
        await asyncio.to_thread(detach_loops, data_dir)
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
    ("custom Python tools", "tests.bench.python_tools_bench"),
    ("cold create", "tests.bench.cold_create_bench"),
    ("tracing overhead", "tests.bench.tracing_bench"),
    ("bash permission analysis", "tests.bench.bash_rules_bench"),
    ("under attack", "tests.bench.attack_bench"),
    ("tool-call path", "tests.bench.toolpath_bench"),
    ("floors", "tests.bench.floor_bench"),
    ("CPU per call against its floor", "tests.bench.cpu_bench"),
    ("grpc engine", "tests.bench.grpc_engine_bench"),
    ("gVisor beside runc", "tests.bench.gvisor_bench"),
    ("fairness between tenants", "tests.bench.fairness_bench"),
    ("CPU between tenants' busy sandboxes", "tests.bench.tenant_cpu_bench"),
    ("accept-header wait", "tests.bench.accept_wait_bench"),
    ("CLI start and the MCP front end", "tests.bench.adopter_bench"),
    ("a session's network through its proxy", "tests.bench.egress_bench"),
    ("snapshots and fork", "tests.bench.snapshot_bench"),
    ("pause and resume", "tests.bench.pause_bench"),
    ("template build", "tests.bench.template_bench"),
)
"""`make bench` then runs the cluster's section (tests.bench.cluster_bench) with a two-node swarm it brings up."""
"""Benchmarks of their own modules (each starts and removes its own control plane), run after the core rows."""


def section_key(module: str) -> str:
    """What `--only` names a section by: its module's name without `_bench` (`fairness`, `gvisor`...)."""
    return module.rsplit(".", 1)[-1].removesuffix("_bench")


async def print_sections(quick: bool, only: list[str] | None = None) -> None:
    for title, module in SECTIONS:
        if only is not None and section_key(module) not in only:
            continue
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
    parser.add_argument("--only", action="append", choices=[section_key(m) for _, m in SECTIONS],
                        help="run only this section (repeatable), without the core rows")
    parser.add_argument("-v", "--verbose", action="store_true", help="control plane logs at INFO, asyncio errors shown")
    args = parser.parse_args()
    if args.samples_scale <= 0:
        parser.error("--samples-scale must be positive")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio_errors = AsyncioErrorCounter(show=args.verbose)
    logging.getLogger("asyncio").addFilter(asyncio_errors)
    try:
        if args.only:
            event_loop.run(print_sections(args.quick, args.only))
        else:
            event_loop.run(run(args, asyncio_errors))  # the loop `controlplane serve` runs on
    except Exception:
        logging.getLogger(__name__).exception("benchmark failed")
    finally:
        for removed in remove_scratch(SCRATCH):
            progress(f"removed scratch dir {removed}")
    return 0  # benchmarks report, they do not gate


if __name__ == "__main__":
    sys.exit(main())
