"""What a tenant's large tool-call arguments may hold in the control plane, through the public API: past the
tenant's running budget (limits.max_args_in_flight_mb) its call waits, past its queue budget
(limits.max_args_queued_mb) the call is RESOURCE_EXHAUSTED with the figures, and past the global budget
(limits.max_args_in_flight_total_mb) another tenant's call waits for room, ahead of the flooding tenant's
queue; every call let in runs to its end."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient, allow_once
from tests.planes import served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "flood", "token": "token-flood-args"},
    {"name": "quiet", "token": "token-quiet-args"},
]
MIB = 1024 * 1024
SIZE = 400_000
"""Two of these fit in a MiB, three do not."""
RUN_S = 3

plane = served_plane("local", tenants=TENANTS, pool={"size": 0},
                     limits={"max_args_in_flight_mb": 1, "max_args_queued_mb": 1, "max_args_in_flight_total_mb": 1})
clients = tenant_clients(TENANTS)


def slow_bash(n: int, seconds: float) -> str:
    """A bash call that runs `seconds`, carrying about SIZE bytes of arguments (in its description, which
    reaches no command line); each differs, since identical calls in a row are asked about as a doom loop."""
    return json.dumps({"command": f"sleep {seconds}", "description": f"call {n} " + "d" * SIZE})


def big_todos(n: int) -> str:
    items = [{"content": f"call {n} item {i:05d}", "status": "pending", "priority": "high"} for i in range(6000)]
    text = json.dumps({"todos": items})
    assert 300_000 < len(text) < 500_000
    return text


async def test_a_tenants_large_calls_wait_past_its_budget_are_refused_past_its_queue_and_others_go_first(
    clients: dict[str, AsyncClient],
) -> None:
    flood, quiet = clients["flood"], clients["quiet"]
    busy = await flood.create_session()
    calm = await quiet.create_session()

    def call(n: int) -> asyncio.Future[Any]:
        return asyncio.ensure_future(flood.execute_tool(busy.id, "bash", slow_bash(n, RUN_S), on_permission=allow_once))

    started = time.monotonic()
    running = [call(0), call(1)]  # 800 KB: both run
    await asyncio.sleep(0.5)
    queued = [call(2), call(3)]  # past the MiB: they wait, 800 KB of queue
    await asyncio.sleep(0.5)
    try:
        fifth = slow_bash(5, RUN_S)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await flood.execute_tool(busy.id, "bash", fifth, on_permission=allow_once)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        held = sum(len(slow_bash(i, RUN_S)) for i in range(2))
        waiting = sum(len(slow_bash(i, RUN_S)) for i in range(2, 4))
        assert refused.value.details() == (
            f"tenant 'flood' has {held} bytes of large tool-call arguments in running calls (limit {MIB}, "
            f"limits.max_args_in_flight_mb) and {waiting} bytes waiting; this call's {len(fifth)} bytes would pass "
            f"the limit of {MIB} bytes waiting (limits.max_args_queued_mb): wait for a call to finish"
        )
        echoed = await quiet.execute_tool(calm.id, "bash", {"command": "echo here", "description": "Echo"},
                                          on_permission=allow_once)
        assert echoed.output.strip() == "here"  # small arguments are not counted: no wait
        assert time.monotonic() - started < RUN_S
        # The global MiB is full: the quiet tenant's large call waits, and goes before flood's queue.
        todo = await quiet.execute_tool(calm.id, "todowrite", big_todos(1))
        quiet_done = time.monotonic() - started
        queued_done = sum(c.done() for c in queued)
    finally:
        outcomes = await asyncio.gather(*running, *queued)
    assert todo.ok, todo.error
    assert todo.result is not None
    assert todo.result.title == "6000 todos"
    assert quiet_done >= RUN_S - 0.5, "the quiet tenant's large call did not wait for room"
    assert queued_done == 0, "the flooding tenant's queued calls went before the quiet tenant's"
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert time.monotonic() - started >= 2 * RUN_S  # the queued ones ran after the first ones, not beside
    again = await flood.execute_tool(busy.id, "bash", slow_bash(6, 0), on_permission=allow_once)
    assert again.ok, again.error  # the ended calls gave their room back
