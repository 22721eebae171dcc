"""A tenant's refused calls cost the control plane a budget, not the client's retry rate: 200 ExecuteTool
streams over a `calls` quota, each retrying at once, get their refusals at the tenant's refusal rate, with the
quota's message, and another tenant's calls run meanwhile (through the public API, real gRPC on loopback)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient, allow_once
from controlplane.core.tenants.refusals import BURST, REFUSAL_PAUSE_S, REFUSALS_PER_S
from tests.planes import served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "flood", "token": "token-flood", "quota": {"calls": 2}},
    {"name": "quiet", "token": "token-quiet"},
]
USED_UP = ("tenant flood's quota of 2 concurrent calls is used up (2 running); "
           "wait for a call to end or ask the operator to raise it")
STREAMS = 200
WINDOW_S = 3.0

plane = served_plane("local", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)


def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "Run"}


async def test_refusals_to_many_retrying_streams_leave_at_the_tenants_rate(clients: dict[str, AsyncClient]) -> None:
    flood, quiet = clients["flood"], clients["quiet"]
    session = (await flood.create_session()).id
    calm = (await quiet.create_session()).id
    await quiet.execute_tool(calm, "bash", bash("echo warm"), on_permission=allow_once)
    # The flood's two slots are taken for the whole window by calls that run.
    running = [asyncio.Event() for _ in range(2)]

    def on_event(i: int) -> Callable[[object], None]:
        return lambda _: running[i].set()

    holders = [asyncio.ensure_future(flood.execute_tool(
        session, "bash", bash(f"sleep {WINDOW_S + 3}; echo {i}"), on_permission=allow_once, on_event=on_event(i),
    )) for i in range(2)]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in running)), 10)
    # A call now is refused, and promptly (after the refusal pause, not behind a queue), naming the quota.
    asked = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await flood.execute_tool(session, "bash", bash("echo probe"), on_permission=allow_once)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == USED_UP
    assert time.monotonic() - asked < REFUSAL_PAUSE_S + 1.0
    await asyncio.sleep(BURST / REFUSALS_PER_S)  # the probe's turn on the schedule is over

    refused: Counter[str] = Counter()
    stop = asyncio.Event()

    async def retrying(i: int) -> None:
        while not stop.is_set():
            try:
                out = await flood.execute_tool(session, "bash", bash(f"echo {i}"), on_permission=allow_once)
                refused[f"ran {out.output!r} {out.error!r}"] += 1
            except grpc.aio.AioRpcError as exc:
                refused[exc.code().name if exc.details() == USED_UP else exc.details() or ""] += 1

    window = time.monotonic()
    streams = [asyncio.ensure_future(retrying(i)) for i in range(STREAMS)]
    await asyncio.sleep(WINDOW_S / 2)
    # Meanwhile another tenant's call runs, not held behind the flood's refusals.
    asked = time.monotonic()
    out = await quiet.execute_tool(calm, "bash", bash("echo calm"), on_permission=allow_once)
    quiet_s = time.monotonic() - asked
    assert out.output == "calm\n"
    await asyncio.sleep(window + WINDOW_S - time.monotonic())
    stop.set()
    seen = dict(refused)
    took = time.monotonic() - window
    for stream in streams:
        stream.cancel()
    await asyncio.gather(*streams, return_exceptions=True)

    assert set(seen) <= {"RESOURCE_EXHAUSTED"}, seen
    # A burst, then the tenant's budget a second: not one refusal per retry of each of the 200 streams
    # (answered at once past eight held ones, they came at 700 to 1,000 a second).
    budget = BURST + REFUSALS_PER_S * took
    assert seen.get("RESOURCE_EXHAUSTED", 0) <= budget * 1.5, (seen, took)
    assert seen.get("RESOURCE_EXHAUSTED", 0) >= REFUSALS_PER_S * (took - REFUSAL_PAUSE_S) / 4, (seen, took)
    assert quiet_s < 2.0, quiet_s
    for holder in holders:
        assert (await holder).output.strip() in ("0", "1")
