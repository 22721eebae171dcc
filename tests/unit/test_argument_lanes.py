"""Large tool-call arguments' thread work in one lane per tenant (controlplane/core/calls/arguments.py): a
tenant's flood of large calls holds one worker thread at a time, another tenant's work is not queued behind
it, and small arguments stay on the loop."""

from __future__ import annotations

import asyncio
import threading

from controlplane.core.calls.arguments import OFF_LOOP_BYTES, TenantLanes


async def test_one_tenants_large_calls_take_one_thread_at_a_time_and_another_tenant_is_not_queued() -> None:
    lanes = TenantLanes()
    running: dict[str, int] = {"flood": 0, "quiet": 0}
    most: dict[str, int] = {"flood": 0, "quiet": 0}
    lock = threading.Lock()
    release = threading.Event()

    def work(tenant: str) -> str:
        with lock:
            running[tenant] += 1
            most[tenant] = max(most[tenant], running[tenant])
        release.wait(5)
        with lock:
            running[tenant] -= 1
        return threading.current_thread().name

    flood = [asyncio.ensure_future(lanes.handled("flood", OFF_LOOP_BYTES, work, "flood")) for _ in range(4)]
    await asyncio.sleep(0.1)
    quiet = asyncio.ensure_future(lanes.handled("quiet", OFF_LOOP_BYTES, work, "quiet"))
    for _ in range(100):  # the quiet tenant's work starts while the flood's first piece still holds its lane
        if running["quiet"]:
            break
        await asyncio.sleep(0.01)
    assert running == {"flood": 1, "quiet": 1}
    release.set()
    names = await asyncio.gather(*flood, quiet)
    assert most == {"flood": 1, "quiet": 1}
    assert threading.main_thread().name not in names


async def test_small_arguments_stay_on_the_loop() -> None:
    lanes = TenantLanes()
    name = await lanes.handled("any", OFF_LOOP_BYTES - 1, lambda: threading.current_thread().name)
    assert name == threading.main_thread().name
