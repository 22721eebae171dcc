"""`make bench`'s control planes (in this process, on 127.0.0.1, with their own instance labels) and the docker
CLI it uses for baselines and for finding what an instance left behind."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from sandbox_agent import event_loop
from tests.bench.bench_common import (
    POOL_REFILL_TIMEOUT_S,
    scratch_dir,
)

# -- docker CLI ------------------------------------------------------------------------------------


async def docker_cli(*args: str, check: bool = True) -> str:
    # subprocess.run starts the CLI with vfork; uvloop's subprocesses fork the whole bench process, which
    # would slow the baselines down (and flatter the ratios against them).
    done = await asyncio.to_thread(subprocess.run, ["docker", *args], capture_output=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({done.returncode}): "
                           f"{done.stderr.decode(errors='replace')}")
    return done.stdout.decode()


def detach_loops(root: Path) -> list[str]:
    """Detaches the loop devices whose backing file is under `root` (a data dir's workspace disk images, which a
    control plane that stopped without deleting its sessions leaves attached); returns their names."""
    detached = []
    prefix = str(root.resolve()) + "/"
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            # The kernel appends " (deleted)" once the image is unlinked; the path before it still tells.
            if not backing.read_text().strip().startswith(prefix):
                continue
        except OSError:
            continue  # detached meanwhile
        device = f"/dev/{backing.parent.parent.name}"
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
        detached.append(device)
    return detached


def remove_scratch(paths: list[Path]) -> list[str]:
    """Removes `paths` (bench_common.SCRATCH) after detaching their loop devices; returns what it did."""
    done = []
    while paths:
        path = paths.pop()
        loops = detach_loops(path) if path.exists() else []
        shutil.rmtree(path, ignore_errors=True)
        done.append(f"{path}" + (f" (detached {', '.join(loops)})" if loops else ""))
    return done


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
    data_dir = scratch_dir("ocb")
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


def run_alone(section: Callable[[bool], Awaitable[list[str]]], doc: str | None,
              scratch: list[Path] | None = None) -> int:
    """A bench section run by itself (`python -m tests.bench.NAME [--quick]`): its lines, then its scratch
    directories removed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    quick = parser.parse_args().quick

    async def run() -> None:
        for line in await section(quick):
            print(line, flush=True)

    try:
        event_loop.run(run())
    finally:
        if scratch is not None:
            remove_scratch(scratch)
    return 0
