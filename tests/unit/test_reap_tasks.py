"""The reaper's per-session tasks: bounded in all and per tenant, one at a time per session, cancelled at close."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.sessions.reap_tasks import PER_TENANT, ReapTasks, succeeded


async def test_a_session_in_flight_is_skipped_and_its_slot_is_freed_when_done() -> None:
    tasks = ReapTasks(at_once=4, per_tenant=4)
    release = asyncio.Event()
    calls: list[str] = []

    async def work() -> bool:
        calls.append("ses_a")
        await release.wait()
        return True

    first = tasks.start("alpha", "ses_a", work)
    assert first is not None
    assert tasks.busy("ses_a")
    assert tasks.start("alpha", "ses_a", work) is None  # handled once at a time
    await asyncio.sleep(0)
    assert calls == ["ses_a"]
    release.set()
    assert await succeeded({"ses_a": first}) == ["ses_a"]
    await asyncio.sleep(0)
    assert not tasks.busy("ses_a")
    again = tasks.start("alpha", "ses_a", work)  # a later round may handle it again
    assert again is not None
    await again


async def test_one_tenants_stalled_sessions_leave_slots_to_the_others() -> None:
    tasks = ReapTasks(at_once=3, per_tenant=2)
    stalled = asyncio.Event()

    async def stall() -> None:
        await stalled.wait()

    assert tasks.start("alpha", "ses_a1", stall) is not None
    assert tasks.start("alpha", "ses_a2", stall) is not None
    assert tasks.start("alpha", "ses_a3", stall) is None  # alpha has its share
    assert tasks.start("beta", "ses_b1", stall) is not None
    assert tasks.start("gamma", "ses_c1", stall) is None  # every slot is taken
    await tasks.close()
    assert not any(tasks.busy(s) for s in ("ses_a1", "ses_a2", "ses_b1"))


async def test_close_cancels_what_is_in_flight_and_waits_for_it() -> None:
    tasks = ReapTasks()
    cleaned = asyncio.Event()

    async def stall() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # a cancelled pause removes its partial copy: close waits for that
            cleaned.set()

    task = tasks.start("alpha", "ses_a", stall)
    await asyncio.sleep(0)
    await tasks.close()
    assert task is not None
    assert task.cancelled()
    assert cleaned.is_set()
    assert tasks.start("alpha", "ses_b", stall) is None  # nothing starts once closed


async def test_a_failure_is_logged_and_frees_the_slot(caplog: pytest.LogCaptureFixture) -> None:
    tasks = ReapTasks(at_once=1)

    async def fail() -> bool:
        raise RuntimeError("engine unreachable")

    task = tasks.start("alpha", "ses_a", fail)
    assert task is not None
    assert await succeeded({"ses_a": task}) == []
    await asyncio.sleep(0)
    assert "ses_a" in caplog.text
    assert "engine unreachable" in caplog.text
    assert tasks.start("alpha", "ses_b", fail) is not None
    await tasks.close()


async def test_many_tenants_stalled_sessions_leave_another_tenant_a_slot() -> None:
    """Four tenants whose agents never answered a copy held all 16 slots of the reaper as it was: a fifth
    tenant's sessions, even those whose expiry needs no copy, were never handled."""
    tasks = ReapTasks()
    stalled = asyncio.Event()
    for tenant in range(8):
        for session in range(PER_TENANT):
            assert tasks.start(f"hostile-{tenant}", f"s-{tenant}-{session}", stalled.wait) is not None
    assert tasks.start("victim", "v", lambda: asyncio.sleep(0)) is not None
    stalled.set()
    await tasks.close()
