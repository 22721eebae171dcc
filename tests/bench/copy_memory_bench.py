"""The control plane's peak memory while it copies a 100 MiB workspace: a SnapshotSession, then a PauseSession, a
ResumeSession and a ForkSession of the same session (snapshot_bench's tree: 400 files of 256 KiB, half random,
half text).

The plane runs as a process of its own (`controlplane serve`, as fairness_bench's planes): its peak RSS (VmHWM) is
reset through /proc/PID/clear_refs before each call and read after it. Rows: MiB of peak RSS above the RSS the
plane had just before the call.

Usage: ``.venv/bin/python -m tests.bench.copy_memory_bench [SOURCE_DIR]``: SOURCE_DIR runs the plane from another
export of the project (the same venv), to compare with an older version.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from controlplane.client import AsyncClient
from tests.bench.bench_common import IMAGE
from tests.bench.snapshot_bench import MAKE_TREE
from tests.planes import remove_instance_leftovers

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


def _status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc status")


def start(source: Path) -> tuple[subprocess.Popen[bytes], Path, str, str]:
    """A plane run from `source`: (its process, data dir, instance, token)."""
    data_dir = Path(f"/tmp/ocsb-copymem-{secrets.token_hex(3)}")
    data_dir.mkdir()
    instance = f"bench-copy-{secrets.token_hex(3)}"
    token = secrets.token_hex(16)
    config = data_dir / "config.toml"
    config.write_text("\n".join([
        f'data_dir = "{data_dir}"', f'instance = "{instance}"', "[server]", 'listen = "127.0.0.1:0"',
        "[provider]", 'type = "docker"', f'image = "{os.environ.get("OCSB_TEST_IMAGE", IMAGE)}"',
        "[pool]", "size = 0", "[[tenants]]", 'name = "bench"', f'token = "{token}"', "",
    ]))
    with (data_dir / "controlplane.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "controlplane", "serve", "--config", str(config), "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=source)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (data_dir / "endpoint").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((data_dir / "controlplane.log").read_text()[-2000:])
        time.sleep(0.05)
    return process, data_dir, instance, token


def _reset_peak(pid: int) -> float:
    """Resets the peak RSS to the current RSS, and returns that."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_mib(pid, "VmRSS")


async def measure(pid: int, address: str, token: str) -> dict[str, tuple[float, float, float]]:
    """{call: (RSS before, peak RSS during, seconds)}."""
    rows: dict[str, tuple[float, float, float]] = {}
    async with AsyncClient(address, token) as client:
        session = await client.create_session()
        made = await client.run(session.id, ["python3", "-c", MAKE_TREE, "/workspace/tree"])
        assert made.exit_code == 0, made.stderr
        for name, call in [("snapshot", client.snapshot), ("pause", client.pause), ("resume", client.resume),
                           ("fork", client.fork)]:
            before = _reset_peak(pid)
            started = time.perf_counter()
            await call(session.id)
            rows[name] = (before, _status_mib(pid, "VmHWM"), time.perf_counter() - started)
        for made_here in await client.list_sessions():  # the fork's too
            await client.delete_session(made_here.id)
    return rows


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO
    process, data_dir, instance, token = start(source)
    try:
        rows = asyncio.run(measure(process.pid, (data_dir / "endpoint").read_text().strip(), token))
    finally:
        process.terminate()
        process.wait(30)
        remove_instance_leftovers(instance)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"plane from {source}")
    print(f"{'call':<10} {'RSS before':>11} {'peak RSS':>9} {'peak - before':>14} {'time':>7}")
    for name, (before, peak, seconds) in rows.items():
        print(f"{name:<10} {before:>8.0f} MiB {peak:>5.0f} MiB {peak - before:>10.0f} MiB {seconds:>6.1f}s")


if __name__ == "__main__":
    main()
