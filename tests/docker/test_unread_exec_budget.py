"""What a tenant's unread Execs make the control plane hold: their output windows share one budget per tenant, so
many Execs whose client stops reading hold the budget and a small floor each, not a window each; the same tenant's
call that is read still completes, and another tenant's Exec streams at full speed meanwhile (through the public
API, real gRPC on loopback, real sandboxes; the hoarding client runs in a process of its own, so
that what gRPC buffers on its side is not counted as the plane's)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

from controlplane.client import AsyncClient
from controlplane.core.calls.output_budget import FLOOR, TENANT_BUDGET
from tests.plane_memory import rss
from tests.planes import served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "hoarder", "token": "token-hoarder"},
    {"name": "neighbour", "token": "token-neighbour"},
]
UNREAD = 80
MARGIN = 24 << 20
"""RSS is coarse: what the plane's allocator and the calls' own state keep beside the bytes held."""
STREAMED = 32 << 20

plane = served_plane("docker", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)



async def hoard(address: str, sessions: list[str]) -> None:
    """Execs of endless output, one event of each read, then none: until stdin closes."""
    client = AsyncClient(address, TENANTS[0]["token"])
    calls = []
    for i in range(UNREAD):
        call = client.exec_call(sessions[i % len(sessions)], ["head", "-c", "64M", "/dev/zero"])
        events = call.__aiter__()
        await events.__anext__()
        calls.append((call, events))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await client.close()


async def streamed_s(client: AsyncClient, session_id: str) -> float:
    asked = time.monotonic()
    result = await client.run(session_id, ["head", "-c", str(STREAMED), "/dev/zero"])
    assert len(result.stdout) == STREAMED
    return time.monotonic() - asked


async def test_many_unread_execs_hold_their_tenants_budget_not_a_window_each(
    plane: Any, clients: dict[str, AsyncClient],
) -> None:
    hoarder, neighbour = clients["hoarder"], clients["neighbour"]
    sessions = [(await hoarder.create_session()).id for _ in range(2)]
    theirs = (await neighbour.create_session()).id
    alone = min([await streamed_s(neighbour, theirs) for _ in range(2)])
    before = rss()
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, plane.plane.address, *sessions, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        assert line == b"ready\n"
        await asyncio.sleep(2)  # every agent has sent what its window allows
        held = rss() - before
        # A window each (1 MiB) held ~88 MiB here; shared, the budget and a floor per call past it.
        bound = TENANT_BUDGET + UNREAD * FLOOR + MARGIN
        assert held < bound, f"{UNREAD} unread Execs grew the plane by {held >> 20} MiB (bound {bound >> 20} MiB)"
        # Another tenant streams at full speed; the hoarder's own call that is read is slowed, never failed.
        beside = await streamed_s(neighbour, theirs)
        # Beside 80 held calls it took 2-3x its time alone on a quiet machine and 4x at load (4.54 s against 1.15 s
        # in a CI run); drawn from the hoarder's spent budget it would crawl at the floor or stall.
        assert beside < 5 * alone + 2.0, f"the neighbour's stream took {beside:.2f} s ({alone:.2f} s alone)"
        own = await hoarder.run(sessions[0], ["head", "-c", str(4 << 20), "/dev/zero"], timeout_ms=60_000)
        assert len(own.stdout) == 4 << 20
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
            await child.wait()


if __name__ == "__main__":
    asyncio.run(hoard(sys.argv[1], sys.argv[2:]))
