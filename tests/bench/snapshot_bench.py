"""Snapshot, restore and fork of a 100 MiB workspace, beside what the same work costs on the host's own disk.

The workspace: 400 files of 256 KiB in 20 directories, half random bytes (incompressible) and half text, made by
the same script in the sandbox and in a host directory. Rows (wall-clock ms seen by the caller):

* ``snapshot`` -- SnapshotSession: the agent's tar over gRPC, gzip level 3 and sha256 into the snapshot dir;
  beside ``tar -c | gzip -3 > file`` of the host tree.
* ``restore`` -- CreateSession(from_snapshot) until READY: checksum, archive check, a sandbox from the warm pool,
  the upload; beside ``tar -xzf`` of the host's archive into an empty directory.
* ``fork`` -- ForkSession until READY: tar from one agent, into a new sandbox's agent (nothing on disk); beside
  ``cp -a`` of the host tree.

Usage: ``.venv/bin/python -m tests.bench.snapshot_bench [--quick]`` (also a section of ``make bench``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import time

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.bench.bench import cleanup
from tests.bench.bench_common import IMAGE, SCRATCH, Row, scratch_dir
from tests.bench.bench_plane import Plane, run_alone

MAKE_TREE = """
import os, random, sys
root = sys.argv[1]
for i in range(400):
    d = os.path.join(root, f"d{i % 20:02d}")
    os.makedirs(d, exist_ok=True)
    r = random.Random(i)
    data = r.randbytes(256 * 1024) if i % 2 else (f"line {i} " * 64 + "\\n").encode() * (256 * 1024 // 513 + 1)
    with open(os.path.join(d, f"f{i:03d}"), "wb") as out:
        out.write(data[: 256 * 1024])
"""


def _timed(argv: list[str] | str) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, shell=isinstance(argv, str), capture_output=True)
    return (time.perf_counter() - start) * 1000


async def section(quick: bool) -> list[str]:
    samples = 1 if quick else 3
    instance = f"bench-snap-{secrets.token_hex(3)}"
    token = secrets.token_hex(16)
    data_dir = scratch_dir("ocsnap")
    settings = load_settings(None, data_dir=data_dir, instance=instance, tenants=[{"name": "bench", "token": token}],
                             provider={"type": "docker", "image": os.environ.get("OCSB_TEST_IMAGE", IMAGE)},
                             pool={"size": 2, "refill_concurrency": 2}, server={"listen": "127.0.0.1:0"})
    plane = await app.start(settings)
    bench = Plane(plane, AsyncClient(plane.address, token), instance, data_dir)
    rows: dict[str, Row] = {k: Row(k, []) for k in ("snapshot", "restore", "fork", "tar", "untar", "cp")}
    notes: list[str] = []
    host = scratch_dir("ocsnaphost")
    try:
        client = bench.client
        source = await client.create_session()
        made = await client.run(source.id, ["python3", "-c", MAKE_TREE, "/workspace/tree"])
        if made.exit_code != 0:
            return [f"making the workspace failed: {made.stderr.decode()[-400:]}"]
        await asyncio.to_thread(subprocess.run, [sys.executable, "-c", MAKE_TREE, str(host / "tree")], check=True)
        size = sum(f.stat().st_size for f in (host / "tree").rglob("*") if f.is_file())
        stored = 0
        for _ in range(samples):
            await bench.wait_pool_full()
            start = time.perf_counter()
            snap = await client.snapshot(source.id)
            rows["snapshot"].samples_ms.append((time.perf_counter() - start) * 1000)
            stored = snap.size_bytes
            await bench.wait_pool_full()
            start = time.perf_counter()
            restored = await client.create_session(from_snapshot=snap.id, deadline_s=600)
            rows["restore"].samples_ms.append((time.perf_counter() - start) * 1000)
            await client.delete_session(restored.id)
            await client.delete_snapshot(snap.id)
            await bench.wait_pool_full()
            start = time.perf_counter()
            fork = await client.fork(source.id)
            rows["fork"].samples_ms.append((time.perf_counter() - start) * 1000)
            await client.delete_session(fork.id)
            archive = host / "tree.tar.gz"
            packing = f"tar -C {host} -cf - tree | gzip -3 > {archive} && sync {archive}"
            rows["tar"].samples_ms.append(await asyncio.to_thread(_timed, packing))
            out = host / "out"
            out.mkdir()
            unpacking = ["tar", "-C", str(out), "-xzf", str(archive)]
            rows["untar"].samples_ms.append(await asyncio.to_thread(_timed, unpacking))
            shutil.rmtree(out)
            copying = ["cp", "-a", str(host / "tree"), str(host / "copy")]
            rows["cp"].samples_ms.append(await asyncio.to_thread(_timed, copying))
            shutil.rmtree(host / "copy")
            archive.unlink()
        await client.delete_session(source.id)
    finally:
        await cleanup([instance], [bench], [data_dir], notes)
    lines = [f"workspace {size / (1 << 20):.0f} MiB in 400 files; snapshot stored {stored / (1 << 20):.1f} MiB; "
             f"{samples} samples (p50 / max ms)"]
    for ours, base, label in (("snapshot", "tar", "tar -c | gzip -3"), ("restore", "untar", "tar -xzf"),
                              ("fork", "cp", "cp -a")):
        a, b = rows[ours], rows[base]
        lines.append(f"{ours:10} {a.p50:9.0f} / {max(a.samples_ms):<9.0f} beside {label:18} {b.p50:8.0f} / "
                     f"{max(b.samples_ms):.0f}")
    return lines + notes


def main() -> int:
    return run_alone(section, __doc__, SCRATCH)


if __name__ == "__main__":
    sys.exit(main())
