"""A 100 MiB file through FileService with the control plane (a real `controlplane serve` process) and the
sandbox agent keeping their memory bounded: both only ever hold a few chunks of it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import docker
import pytest

from controlplane.client import AsyncClient
from tests.planes import PlaneProcess, new_instance, remove_data_dir, remove_instance_leftovers, short_tmp

pytestmark = pytest.mark.docker

SIZE = 100 * 1024 * 1024
GROWTH_BOUND = 64 * 1024 * 1024
"""Peak resident memory a process may add while the file passes through it (well under the file's size)."""


def _kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts again from the current RSS


def _agent_peak(instance: str, sandbox_id: str, reset: bool) -> int:
    """The sandbox agent's peak RSS (bytes), read in its container; `reset` starts a new peak first."""
    container = docker.from_env().containers.get(f"ocsb-{instance}-{sandbox_id}")
    script = ("for p in /proc/[0-9]*; do if grep -q sandbox_agent $p/cmdline 2>/dev/null && "
              "grep -q '^Uid:[[:space:]]*0' $p/status; then "
              + ("echo 5 > $p/clear_refs; " if reset else "") + "grep VmHWM $p/status; fi; done")
    output = container.exec_run(["/bin/sh", "-c", script]).output
    assert isinstance(output, bytes)
    out = output.decode()
    return max(int(line.split()[1]) * 1024 for line in out.splitlines() if line.startswith("VmHWM"))


@pytest.fixture
async def served() -> AsyncIterator[tuple[PlaneProcess, AsyncClient]]:
    data_dir, instance = short_tmp(), new_instance("files-mem")
    plane = PlaneProcess(data_dir, instance, pool_size=0)
    try:
        target = await plane.start()
        async with AsyncClient(target, plane.token()) as client:
            yield plane, client
            for session in await client.list_sessions():
                await client.delete_session(session.id)
    finally:
        await plane.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_100_mib_round_trip_in_bounded_memory(served: tuple[PlaneProcess, AsyncClient], tmp_path: Path) -> None:
    plane, client = served
    assert plane.proc is not None
    pid = plane.proc.pid
    session = await client.create_session()
    await client.write_file(session.id, "warm.bin", b"w" * (2 * 1024 * 1024))  # first-use allocations
    assert len(await client.read_file(session.id, "warm.bin")) == 2 * 1024 * 1024
    source = tmp_path / "big.bin"
    block = os.urandom(1024 * 1024)
    with source.open("wb") as out:
        for i in range(SIZE // len(block)):
            out.write(bytes([i % 256]) + block[1:])
    digest = hashlib.sha256(source.read_bytes()).hexdigest()

    base = _kib(pid, "VmRSS")
    _reset_peak(pid)
    agent_base = _agent_peak(plane.instance, session.sandbox_id, reset=True)
    info = await client.write_file(session.id, "big/file.bin", source)
    assert info.size == SIZE
    got = await client.download(session.id, ["big/file.bin"], dest=tmp_path / "down")
    assert got.extracted == ["big/file.bin"]
    assert hashlib.sha256((tmp_path / "down" / "big" / "file.bin").read_bytes()).hexdigest() == digest
    read = await client.read_file(session.id, "big/file.bin")
    assert hashlib.sha256(read).hexdigest() == digest
    del read
    growth = _kib(pid, "VmHWM") - base
    agent_growth = _agent_peak(plane.instance, session.sandbox_id, reset=False) - agent_base
    print(f"control plane: RSS before {base >> 20} MiB, peak growth {growth / 2**20:.1f} MiB; agent: peak growth "
          f"{agent_growth / 2**20:.1f} MiB, for {SIZE >> 20} MiB written, downloaded and read")
    assert growth < GROWTH_BOUND
    assert agent_growth < GROWTH_BOUND
