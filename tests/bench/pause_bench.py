"""Pause and resume of a session, with an empty workspace and with the 100 MiB one of snapshot_bench, beside
creating a session from nothing.

Rows (wall-clock ms seen by the caller):

* ``pause`` -- PauseSession: the agent's tar over gRPC, gzip level 3 and sha256 into the snapshot dir, then the
  container and its volume removed.
* ``resume`` -- ResumeSession until READY: checksum, a sandbox from the warm pool, the upload, the custom-code
  snapshot; beside ``create``, CreateSession of an empty session from the same pool.
* the two halves of a pause apart, on the 100 MiB workspace: ``snapshot`` (SnapshotSession, the same copy) and
  ``delete`` (DeleteSession of a session holding the same tree: the container, volume and disk image removed).

Usage: ``.venv/bin/python -m tests.bench.pause_bench [--quick]`` (also a section of ``make bench``).
"""

from __future__ import annotations

import os
import secrets
import sys
import time

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.bench.bench import cleanup
from tests.bench.bench_common import IMAGE, SCRATCH, Row, scratch_dir
from tests.bench.bench_plane import Plane, run_alone
from tests.bench.snapshot_bench import MAKE_TREE


async def section(quick: bool) -> list[str]:
    samples = 1 if quick else 3
    instance = f"bench-pause-{secrets.token_hex(3)}"
    token = secrets.token_hex(16)
    data_dir = scratch_dir("ocpause")
    settings = load_settings(None, data_dir=data_dir, instance=instance, tenants=[{"name": "bench", "token": token}],
                             provider={"type": "docker", "image": os.environ.get("OCSB_TEST_IMAGE", IMAGE)},
                             pool={"size": 2, "refill_concurrency": 2}, server={"listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    bench = Plane(plane, AsyncClient(plane.address, token), instance, data_dir)
    rows: dict[str, Row] = {k: Row(k, []) for k in ("create", "pause empty", "resume empty", "pause 100 MiB",
                                                      "resume 100 MiB", "snapshot 100 MiB", "delete 100 MiB")}
    notes: list[str] = []
    try:
        client = bench.client
        empty = await client.create_session()
        big = await client.create_session()
        made = await client.run(big.id, ["python3", "-c", MAKE_TREE, "/workspace/tree"])
        if made.exit_code != 0:
            return [f"making the workspace failed: {made.stderr.decode()[-400:]}"]
        for _ in range(samples):
            await bench.wait_pool_full()
            start = time.perf_counter()
            fresh = await client.create_session()
            rows["create"].samples_ms.append((time.perf_counter() - start) * 1000)
            await client.delete_session(fresh.id)
            for session, label in ((empty, "empty"), (big, "100 MiB")):
                await bench.wait_pool_full()
                start = time.perf_counter()
                await client.pause(session.id)
                rows[f"pause {label}"].samples_ms.append((time.perf_counter() - start) * 1000)
                await bench.wait_pool_full()
                start = time.perf_counter()
                await client.resume(session.id)
                rows[f"resume {label}"].samples_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            snap = await client.snapshot(big.id)
            rows["snapshot 100 MiB"].samples_ms.append((time.perf_counter() - start) * 1000)
            await client.delete_snapshot(snap.id)
            doomed = await client.create_session()
            await client.run(doomed.id, ["python3", "-c", MAKE_TREE, "/workspace/tree"])
            start = time.perf_counter()
            await client.delete_session(doomed.id)
            rows["delete 100 MiB"].samples_ms.append((time.perf_counter() - start) * 1000)
        await client.delete_session(empty.id)
        await client.delete_session(big.id)
    finally:
        await cleanup([instance], [bench], [data_dir], notes)
    lines = [f"{samples} samples (p50 / max ms); resumes take a sandbox from the warm pool (size 2)"]
    for row in rows.values():
        lines.append(f"{row.name:15} {row.p50:9.0f} / {max(row.samples_ms):.0f}")
    return lines + notes


def main() -> int:
    return run_alone(section, __doc__, SCRATCH)


if __name__ == "__main__":
    sys.exit(main())
