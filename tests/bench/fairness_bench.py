"""Fairness between tenants (issue 22): tenant B's CreateSession and `bash echo` latency alone, then while
tenant A floods the same control plane, with the control plane's peak memory during each.

One real Docker-backed control plane runs as a process of its own (`controlplane serve`, so its memory is its
own: VmHWM from /proc, reset before each phase through clear_refs), with two tenants: A with a quota of
A_QUOTA sessions and A_CALLS concurrent calls, B unlimited. Its pool is empty, so every create of either
tenant is a cold one and B's creates compare like with like (a shared warm pool that A drains would turn B's
creates cold whatever the platform schedules). A's floods run in another process (tests/bench/fairness_flood.py)
so that building them costs the measuring process nothing:

* creates: more workers than A's quota, each creating and deleting sessions (the extra ones are refused);
* calls: more concurrent `bash` calls than A's calls quota;
* archive bombs: CreateSession with half-MiB archives declaring 512 MiB (a PAX header, a GNU long name, gzip
  inside gzip), refused by the control plane;
* huge arguments: `todowrite` calls whose arguments are just under limits.max_args_bytes;
* refused calls: 50 streams of `bash` calls retrying at once, from a tenant of its own ("a2", with the sessions
  quota of A and a calls quota of REFUSED_CALLS), so almost every call is refused (what a refusal costs).

Each row: B's p50/p99 during the flood and the ratio of its p99 to B alone (target: within 2x), the control
plane's peak RSS, and what A's flood did. Bounded: each phase stops sampling after PHASE_BUDGET_S.

Samples: 16 creates and 192 `bash` calls per phase, so a `bash` p99 lies between the second and third slowest call
instead of being the slowest (a create's p99 is still close to its slowest). Each phase stops sampling after
PHASE_BUDGET_S (40 s): the section takes about 1 to 4 minutes (say its wall time, printed at its end).

Run alone: `.venv/bin/python -m tests.bench.bench --only fairness`. `OCSB_BENCH_TENANT_CPU_WEIGHT=false` runs
the plane with `provider.tenant_cpu_weight = false` (every sandbox one CPU weight, as before tenant parents), for
runs alternating with and without them.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from controlplane.client import AsyncClient, allow_once
from tests.bench.bench_common import IMAGE, Row, progress, scratch_dir
from tests.bench.bench_plane import docker_cli, leftovers, remove_scratch
from tests.bench.fairness_flood import KINDS

A_QUOTA = 4
A_CALLS = 8
REFUSED_CALLS = 2
"""The calls quota of tenant a2, which floods refused calls (A's own quota stays what the other phases had)."""
ARGS_LIMIT = 8 * 1024 * 1024
TARGET_RATIO = 2.0
PHASE_BUDGET_S = 40.0
RAMP_S = 1.0
"""A's flood runs this long before B's first sample."""
START_TIMEOUT_S = 60.0


@dataclass
class ServedPlane:
    process: subprocess.Popen[bytes]
    data_dir: Path
    instance: str
    address: str

    def reset_peak(self) -> bool:
        """Resets the process's peak RSS (VmHWM) to its current RSS; False where the kernel refuses."""
        try:
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def cpu_seconds(self) -> float:
        """User and system CPU time of the control plane process so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_mib(self) -> float:
        return _hwm_mib(self.process.pid)

    def children(self) -> list[int]:
        """The control plane's child processes (its argument worker), whose memory is the plane's doing too."""
        pids: list[int] = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                pids += [int(pid) for pid in (task / "children").read_text().split()]
            except OSError:
                continue
        return pids

    def reset_children(self) -> None:
        for pid in self.children():
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                continue

    def children_peak_mib(self) -> float:
        """The largest peak RSS among the plane's children (0: none running)."""
        peaks = [0.0]
        for pid in self.children():
            try:
                peaks.append(_hwm_mib(pid))
            except (OSError, RuntimeError):
                continue
        return max(peaks)


def _hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def config_text(data_dir: Path, instance: str, tokens: dict[str, str]) -> str:
    image = os.environ.get("OCSB_TEST_IMAGE", IMAGE)
    return "\n".join([
        f'data_dir = "{data_dir}"',
        f'instance = "{instance}"',
        "[server]", 'listen = "127.0.0.1:0"',
        "[provider]", 'type = "docker"', f'image = "{image}"', *_weights(),
        "[pool]", "size = 0",
        "[limits]", f"max_args_bytes = {ARGS_LIMIT}",
        "[[tenants]]", 'name = "a"', f'token = "{tokens["a"]}"',
        f"quota = {{ sessions = {A_QUOTA}, calls = {A_CALLS} }}",
        "[[tenants]]", 'name = "b"', f'token = "{tokens["b"]}"',
        "[[tenants]]", 'name = "a2"', f'token = "{tokens["a2"]}"',
        f"quota = {{ sessions = {A_QUOTA}, calls = {REFUSED_CALLS} }}",
        "",
    ])


def tenant_weights() -> str:
    """Whether the bench's plane puts tenants under CPU parents of their own: "on" or "off"."""
    return "off" if os.environ.get("OCSB_BENCH_TENANT_CPU_WEIGHT", "").lower() == "false" else "on"


def _weights() -> list[str]:
    return [] if tenant_weights() == "on" else ["tenant_cpu_weight = false"]


async def start_served(instance: str, tokens: dict[str, str]) -> ServedPlane:
    data_dir = scratch_dir("ocsb-bench-fair-")
    config = data_dir / "config.toml"
    config.write_text(config_text(data_dir, instance, tokens))
    return await serve(config, data_dir, instance, START_TIMEOUT_S)


async def serve(config: Path, data_dir: Path, instance: str, timeout_s: float) -> ServedPlane:
    """`controlplane serve` with `config`, in a process of its own (its CPU and memory are its own), once its
    endpoint file says it listens."""
    log = (data_dir / "controlplane.log").open("wb")
    process = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "controlplane", "serve", "--config", str(config), "--log-level", "WARNING"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    log.close()
    endpoint = data_dir / "endpoint"
    deadline = time.monotonic() + timeout_s
    while not endpoint.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            said = (data_dir / "controlplane.log").read_text()[-2000:]
            raise RuntimeError(f"the control plane did not start: {said}")
        await asyncio.sleep(0.05)
    return ServedPlane(process, data_dir, instance, endpoint.read_text().strip())


async def stop_served(plane: ServedPlane) -> None:
    plane.process.terminate()
    try:
        await asyncio.to_thread(plane.process.wait, 30)
    except subprocess.TimeoutExpired:
        plane.process.kill()
        await asyncio.to_thread(plane.process.wait)


@dataclass
class Phase:
    title: str
    create: Row
    bash: Row
    peak_mib: float
    worker_peak_mib: float
    """The plane's argument worker process (a child of the plane), 0 when none ran."""
    cpu_share: float
    """The control plane's CPU time during the phase over its wall time (1.0: one core all the time)."""
    flood: dict[str, int]
    flood_s: float = 0.0
    """How long A's flood ran (its ramp, B's sampling and its stop): its "ok" counts over this are A's rate."""

    def a_rate(self) -> float:
        done = sum(n for what, n in self.flood.items() if what.endswith(" ok"))
        return done / self.flood_s if self.flood_s > 0 else 0.0


async def measure_b(client: AsyncClient, session_id: str, creates: int, bash_per_create: int) -> tuple[Row, Row]:
    """Interleaved, so that both rows see the same stretch of the flood: `bash_per_create` echo calls, then
    one create (its delete is not timed), `creates` times or until the phase's time is up."""
    create_ms: list[float] = []
    bash_ms: list[float] = []
    deadline = time.monotonic() + PHASE_BUDGET_S
    for _ in range(creates):
        for _ in range(bash_per_create):
            started = time.perf_counter()
            out = await client.execute_tool(session_id, "bash", {"command": "echo hi", "description": "Echo"},
                                            on_permission=allow_once)
            bash_ms.append((time.perf_counter() - started) * 1000)
            if out.output != "hi\n":
                raise RuntimeError(f"B's bash call answered {out.output!r} {out.error!r}")
        started = time.perf_counter()
        made = await client.create_session()
        create_ms.append((time.perf_counter() - started) * 1000)
        await client.delete_session(made.id)
        if time.monotonic() > deadline:
            break
    return Row("create", create_ms), Row("bash", bash_ms)


async def run_flood(kind: str, plane: ServedPlane, token: str) -> subprocess.Popen[bytes]:
    process = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "tests.bench.fairness_flood", kind, plane.address, token, str(ARGS_LIMIT)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    line = await asyncio.to_thread(process.stdout.readline)
    if line.strip() != b"ready":
        process.kill()
        raise RuntimeError(f"flood {kind!r} did not start: {line!r}")
    return process


async def end_flood(process: subprocess.Popen[bytes]) -> dict[str, int]:
    process.terminate()
    try:
        out, _ = await asyncio.to_thread(process.communicate, None, 60)
    except subprocess.TimeoutExpired:
        process.kill()
        await asyncio.to_thread(process.wait)
        return {"flood process killed": 1}
    try:
        counts: dict[str, int] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"flood process failed": process.returncode or 1}
    return counts


async def phases(plane: ServedPlane, tokens: dict[str, str], quick: bool,
                 kinds: tuple[str, ...] = KINDS) -> list[Phase]:
    creates, bash_per_create = (4, 5) if quick else (16, 12)
    b = AsyncClient(plane.address, tokens["b"])
    done: list[Phase] = []
    try:
        own = await b.create_session()
        await b.execute_tool(own.id, "bash", {"command": "echo warm", "description": "Warm"},
                             on_permission=allow_once)
        for kind in (None, *kinds):
            title = "B alone" if kind is None else f"A floods {kind}"
            progress(f"fairness: {title}")
            flood_started = time.monotonic()
            flood = await run_flood(kind, plane, tokens["a2" if kind == "refused calls" else "a"]) if kind else None
            try:
                if flood is not None:
                    await asyncio.sleep(RAMP_S)
                plane.reset_peak()
                plane.reset_children()
                cpu, wall = plane.cpu_seconds(), time.monotonic()
                create, bash = await measure_b(b, own.id, creates, bash_per_create)
                peak, worker_peak = plane.peak_mib(), plane.children_peak_mib()
                share = (plane.cpu_seconds() - cpu) / (time.monotonic() - wall)
            finally:
                counts = await end_flood(flood) if flood is not None else {}
            flood_s = time.monotonic() - flood_started if flood is not None else 0.0
            done.append(Phase(title, create, bash, peak, worker_peak, share, counts, flood_s))
        await b.delete_session(own.id)
    finally:
        await b.close()
    return done


def _ratio(row: Row, alone: Row) -> float:
    return row.p99 / alone.p99 if alone.p99 > 0 else float("inf")


def table(done: list[Phase], peak_reset: bool) -> list[str]:
    alone = done[0]
    lines = [
        f"fairness: tenant B alone and while tenant A floods (one control plane in its own process; A's quota "
        f"{A_QUOTA} sessions, {A_CALLS} calls; pool 0, so every create is cold; tenant CPU weights "
        f"{tenant_weights()}; target: B's p99 within {TARGET_RATIO:g}x of B alone)",
        f"  {'phase':26} {'B create p50/p99 ms':>21} {'p99 x':>6} {'B bash p50/p99 ms':>19} {'p99 x':>6} "
        f"{'peak RSS MiB':>12} {'worker':>6} {'CPU':>5} {'A ok/s':>6}  A's flood",
    ]
    for phase in done:
        cr, br = _ratio(phase.create, alone.create), _ratio(phase.bash, alone.bash)
        verdict = "" if phase is alone else ("PASS" if max(cr, br) <= TARGET_RATIO else "FAIL")
        flood = ", ".join(f"{v} {k}" for k, v in sorted(phase.flood.items()))
        lines.append(
            f"  {phase.title:26} {phase.create.p50:9.1f} / {phase.create.p99:<9.1f} {cr:5.2f}x "
            f"{phase.bash.p50:8.1f} / {phase.bash.p99:<8.1f} {br:5.2f}x {phase.peak_mib:12.0f} "
            f"{phase.worker_peak_mib:6.0f} {phase.cpu_share:5.0%} {phase.a_rate():6.1f}  "
            f"{verdict} {flood}".rstrip()
        )
    samples = f"n = {len(alone.create.samples_ms)} creates and {len(alone.bash.samples_ms)} bash calls per phase"
    peak = "peak RSS reset before each phase" if peak_reset else "peak RSS since the plane started (no clear_refs)"
    peak += "; worker: the peak RSS of the plane's argument worker process; CPU: the control plane's CPU time"
    peak += " over the phase's wall time; A ok/s: A's flood's successful creates or calls a second over its run"
    lines.append(f"  ({samples}; {peak}; /proc/loadavg at the end: {Path('/proc/loadavg').read_text().strip()})")
    return lines


async def section(quick: bool, kinds: tuple[str, ...] = KINDS) -> list[str]:
    instance = f"bench-fair-{secrets.token_hex(3)}"
    tokens = {"a": secrets.token_hex(16), "b": secrets.token_hex(16), "a2": secrets.token_hex(16)}
    plane = await start_served(instance, tokens)
    try:
        started = time.monotonic()
        peak_reset = plane.reset_peak()
        done = await phases(plane, tokens, quick, kinds)
        lines = table(done, peak_reset)
        lines.append(f"  section wall time {time.monotonic() - started:.0f} s")
        return lines
    finally:
        await stop_served(plane)
        await remove_leftovers(plane)


async def remove_leftovers(plane: ServedPlane) -> None:
    containers, volumes = await leftovers(plane.instance)
    for cid in containers:
        await docker_cli("rm", "-f", "-v", cid, check=False)
    for volume in volumes:
        await docker_cli("volume", "rm", "-f", volume, check=False)
    # Run alone (not from bench.py, which removes every scratch dir at its end) it still leaves nothing.
    await asyncio.to_thread(remove_scratch, [plane.data_dir])
