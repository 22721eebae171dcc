"""Flow control of a command's output through the public Exec, on a real sandbox: a client that does not read holds
the command (blocked on write in its container, not killed) instead of growing the control plane, and gets every
byte once it reads. The plane runs in this process: its RSS is what is measured."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.plane_memory import rss_mib
from tests.planes import Plane

pytestmark = pytest.mark.docker

SIZE = 2 << 30
GROWTH_MIB = 150
"""What the plane (and this test's client) may grow by: windows and gRPC's buffers, never the command's output
(on main the plane held it all: +3.3 GiB in 22 s for a client that stopped reading)."""



async def written(plane: Plane, session_id: str, pid: int) -> int:
    io = await plane.client.run(session_id, ["cat", f"/proc/{pid}/io"])
    return next(int(line.split()[1]) for line in io.stdout.decode().splitlines() if line.startswith("wchar:"))


async def test_an_exec_whose_client_does_not_read_blocks_the_command_not_the_plane(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    before = peak = rss_mib()
    call = docker_plane.client.exec_call(session.id, ["head", "-c", str(SIZE), "/dev/zero"], timeout_ms=600_000)
    events = call.__aiter__()
    first = await anext(events)
    assert first.WhichOneof("event") == "started_pid"
    for _ in range(10):  # five seconds of not reading: on main the plane took some 700 MiB of it by then
        await asyncio.sleep(0.5)
        peak = max(peak, rss_mib())
    assert peak - before < GROWTH_MIB, f"the plane grew by {peak - before} MiB for a client that does not read"
    held = await written(docker_plane, session.id, first.started_pid)
    await asyncio.sleep(1)
    assert await written(docker_plane, session.id, first.started_pid) == held < 256 << 20  # blocked, alive
    total, exited = 0, None
    began = time.monotonic()
    async for event in events:
        kind = event.WhichOneof("event")
        if kind == "stdout":
            total += len(event.stdout)
            if total % (64 << 20) < len(event.stdout):
                peak = max(peak, rss_mib())
        elif kind == "exited":
            exited = event.exited
    assert total == SIZE
    assert exited is not None
    assert (exited.exit_code, exited.aborted, exited.timed_out) == (0, False, False)
    assert peak - before < GROWTH_MIB, f"the plane grew by {peak - before} MiB while the client read"
    print(f"2 GiB through Exec in {time.monotonic() - began:.1f} s; plane growth peaked at {peak - before} MiB")
