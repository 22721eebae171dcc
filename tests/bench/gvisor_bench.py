"""The core rows on gVisor beside runc (issue 22, part 4): warm acquire, cold create, exec/read/bash round trips.

For each runtime, a control plane whose one tenant's `[[tenants]]` entry names the runtime (so its sessions
and its warm pool run on it), measured with the core rows' own functions (tests/bench/bench.py); then a
second plane with no pool for the cold creates. Where runsc cannot run here the gVisor rows say why.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.bench.bench import cleanup
from tests.bench.bench_common import BENCH_FILE, BENCH_TEXT, IMAGE, POOL_SIZE, Row, sample_counts, scratch_dir
from tests.bench.bench_measures import bench_create, bench_exec, bench_tool
from tests.bench.bench_plane import Plane
from tests.runtimes import RUNTIMES, runsc_missing

ROWS = ("warm", "cold", "exec", "tool_read", "tool_bash")
TITLES = {"warm": "session create (warm pool)", "cold": "session create (cold)", "exec": "exec round trip (true)",
          "tool_read": "tool read (small file)", "tool_bash": "tool bash echo"}


async def start(instance: str, runtime: str, pool_size: int) -> Plane:
    data_dir = scratch_dir("ocg")
    token = secrets.token_hex(16)
    tenant = {"name": "bench", "token": token, **({"runtime": runtime} if runtime != "runc" else {})}
    settings = load_settings(None, data_dir=data_dir, instance=instance, tenants=[tenant],
                             provider={"type": "docker", "image": os.environ.get("OCSB_TEST_IMAGE", IMAGE)},
                             pool={"size": pool_size, "refill_concurrency": 2}, server={"listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    return Plane(plane, AsyncClient(plane.address, token), instance, data_dir)


async def measure(runtime: str, counts: dict[str, int], prefix: str) -> dict[str, Row]:
    rows: dict[str, Row] = {}
    notes: list[str] = []
    instances = [f"{prefix}-{runtime}-w", f"{prefix}-{runtime}-c"]
    planes: list[Plane] = []
    dirs: list[Path] = []
    try:
        warm = await start(instances[0], runtime, POOL_SIZE)
        planes.append(warm)
        dirs.append(warm.data_dir)
        await warm.wait_pool_full()
        samples, _ = await bench_create(warm, counts["warm"], warm=True)
        rows["warm"] = Row(TITLES["warm"], samples)
        await warm.wait_pool_full()
        session = await warm.client.create_session()
        rows["exec"] = Row(TITLES["exec"], await bench_exec(warm.client, session.id, counts["exec"],
                                                            counts["exec_warmup"]))
        await warm.client.run(session.id, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", BENCH_TEXT, BENCH_FILE])
        read, _ = await bench_tool(warm.client, session.id, "read", {"filePath": BENCH_FILE}, "1: line 1:",
                                   counts["tool_read"], counts["tool_warmup"])
        rows["tool_read"] = Row(TITLES["tool_read"], read)
        bash, _ = await bench_tool(warm.client, session.id, "bash", {"command": "echo hi", "description": "Echo"},
                                   "hi", counts["tool_bash"], counts["tool_warmup"])
        rows["tool_bash"] = Row(TITLES["tool_bash"], bash)
        await warm.client.delete_session(session.id)
        planes.remove(warm)
        await warm.client.close()
        await app.stop(warm.plane)
        cold = await start(instances[1], runtime, 0)
        planes.append(cold)
        dirs.append(cold.data_dir)
        samples, _ = await bench_create(cold, counts["cold"], warm=False)
        rows["cold"] = Row(TITLES["cold"], samples)
    finally:
        await cleanup(instances, planes, dirs, notes)
    return rows


async def section(quick: bool) -> list[str]:
    counts = sample_counts(quick, 0.5)  # half the core rows' samples: the same figures, twice
    prefix = f"bench-rt-{secrets.token_hex(3)}"
    measured: dict[str, dict[str, Row]] = {}
    lines = []
    for runtime in RUNTIMES:
        reason = runsc_missing() if runtime == "runsc" else None
        if reason is not None:
            lines.append(f"gVisor rows skipped: {reason}")
            continue
        try:
            measured[runtime] = await measure(runtime, counts, prefix)
        except Exception as exc:  # one runtime's failure must not hide the other's figures
            lines.append(f"{runtime}: the measurement failed: {exc!r}")
    lines.append(f"{'row':34} " + " ".join(f"{r + ' p50/p99 ms':>22}" for r in measured))
    for key in ROWS:
        cells = []
        for runtime in measured:
            row = measured[runtime].get(key)
            cells.append(f"{row.p50:>10.2f} / {row.p99:<9.2f}" if row else f"{'-':>22}")
        lines.append(f"{TITLES[key]:34} " + " ".join(cells))
    return lines
