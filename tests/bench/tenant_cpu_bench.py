"""CPU between tenants when every sandbox is busy: tenant A runs a CPU-bound loop in each of its four sessions,
tenant B in its one, for BURN_S seconds at once; each tenant's CPU-seconds (GetUsage, read from its sandboxes'
cgroups) over that time, with tenant CPU weights off (every sandbox one weight) and on (each tenant's sandboxes
under a parent of its own: sandbox/tenant_cgroups.py), alternating.

On 2 CPUs with sessions of one CPU each: off, five equal sandboxes get 0.4 CPU each, so B gets a fifth of what
the two tenants use together; on, B gets half (its one CPU), and A's four share the other. The other processes of
the machine take their part of the CPUs too; the ratio B / (A + B) is within one run. About 40 s.

Run alone: `.venv/bin/python -m tests.bench.bench --only tenant_cpu`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any

from controlplane import app
from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.bench.bench_common import IMAGE
from tests.planes import new_instance, remove_instance_leftovers, short_tmp

A_SESSIONS = 4
BURN_S = 8.0
BURN = "import time\nend = time.time() + {s}\nwhile time.time() < end:\n    pass\n"
TENANTS = [{"name": "a", "token": "bench-token-a"}, {"name": "b", "token": "bench-token-b"}]


async def one_run(weights: bool, burn_s: float) -> tuple[float, float]:
    """CPU-seconds of A's and B's sandboxes while all of them burn for `burn_s`."""
    data_dir, instance = short_tmp(), new_instance("bcpu")
    provider: dict[str, Any] = {"type": "docker", "image": os.environ.get("OCSB_TEST_IMAGE", IMAGE),
                                "tenant_cpu_weight": weights}
    settings = load_settings(None, data_dir=data_dir, instance=instance, provider=provider, tenants=TENANTS,
                             pool={"size": 0}, server={"listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    try:
        admin = AsyncAdminClient(plane.address, plane.settings.admin_token_file.read_text().strip())
        a, b = AsyncClient(plane.address, "bench-token-a"), AsyncClient(plane.address, "bench-token-b")
        try:
            a_ids = [(await a.create_session()).id for _ in range(A_SESSIONS)]
            b_id = (await b.create_session()).id
            before = [(await admin.usage(t)).cpu_seconds for t in ("a", "b")]
            argv = ["python3", "-c", BURN.format(s=burn_s)]
            await asyncio.gather(*(a.run(s, argv) for s in a_ids), b.run(b_id, argv))
            after = [(await admin.usage(t)).cpu_seconds for t in ("a", "b")]
            for client, ids in ((a, a_ids), (b, [b_id])):
                for session_id in ids:
                    await client.delete_session(session_id)
        finally:
            for closing in (a, b, admin):
                await closing.close()
    finally:
        await app.stop(plane)
        remove_instance_leftovers(instance)
        shutil.rmtree(data_dir, ignore_errors=True)
    return after[0] - before[0], after[1] - before[1]


async def section(quick: bool) -> list[str]:
    burn_s = BURN_S / 2 if quick else BURN_S
    lines = [f"tenant CPU: A burns CPU in {A_SESSIONS} sessions, B in 1, for {burn_s:g} s at once (sessions of "
             f"1 CPU; {os.cpu_count()} CPUs); CPU-seconds each tenant's sandboxes used",
             f"  {'tenant CPU weights':20} {'A CPU-s':>8} {'B CPU-s':>8} {'B / (A+B)':>10}  load before"]
    started = time.monotonic()
    for weights in (False, True, False, True):
        load = (await asyncio.to_thread(Path("/proc/loadavg").read_text)).split()[0]
        used_a, used_b = await one_run(weights, burn_s)
        share = used_b / (used_a + used_b) if used_a + used_b > 0 else float("nan")
        lines.append(f"  {'on' if weights else 'off':20} {used_a:8.2f} {used_b:8.2f} {share:10.0%}  {load}")
    end_load = (await asyncio.to_thread(Path("/proc/loadavg").read_text)).strip()
    lines.append(f"  section wall time {time.monotonic() - started:.0f} s; /proc/loadavg at the end: {end_load}")
    return lines
