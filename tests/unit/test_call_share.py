"""The fair share of calls among tenants (controlplane/core/tenants/call_share.py): a lone tenant keeps its whole
quota; while another tenant calls, or called a moment ago, a busy tenant runs its share and its other calls wait
their turn (not refused); the other tenant starts at once; a waiting call that is cancelled leaves the queue; the
busy tenant is never starved."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from controlplane.core.tenants.call_share import CallShare
from controlplane.core.tenants.quota import Quota, QuotaExceededError, TenantQuotas


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _turns(share: CallShare, tenant: str, n: int, limit: int | None) -> list[Callable[[], None]]:
    return [await share.turn(tenant, limit) for _ in range(n)]


async def test_a_lone_tenant_keeps_its_whole_quota() -> None:
    share = CallShare(width=2)
    ends = await asyncio.wait_for(_turns(share, "a", 8, 8), 1)
    assert share.running("a") == 8
    for end in ends:
        end()
    assert share.running("a") == 0


async def test_with_another_tenant_calling_the_busy_one_waits_beyond_its_share() -> None:
    share = CallShare(width=2)
    a_ends = await _turns(share, "a", 8, 8)  # alone: its whole quota runs
    b_end = await asyncio.wait_for(share.turn("b", None), 1)  # the other tenant starts at once
    assert share.share("a", 8) == 1
    a_next = asyncio.ensure_future(share.turn("a", 8))
    await asyncio.sleep(0)
    assert not a_next.done()
    assert share.waiting("a") == 1
    for end in a_ends[:-1]:  # A gives back what it holds beyond its share as its calls end
        end()
    await asyncio.sleep(0)
    assert not a_next.done()
    a_ends[-1]()
    await asyncio.sleep(0)
    assert a_next.done()  # its share is one: it runs again once its last one ended
    assert share.running("a") == 1
    b_end()
    a_next.result()()


async def test_the_other_tenant_counts_as_active_a_while_after_its_call_and_then_not() -> None:
    clock = Clock()
    share = CallShare(width=4, recent_s=1.5, clock=clock)
    a_ends = await _turns(share, "a", 2, 8)
    b_end = await share.turn("b", None)
    b_end()  # B's call ended; its next comes soon (sequential calls)
    assert share.share("a", 8) == 2
    clock.now += 1.0
    assert share.share("a", 8) == 2
    clock.now += 0.6
    assert share.share("a", 8) == 8  # B quiet for longer than the window: A alone again
    for end in a_ends:
        end()


async def test_waiting_calls_are_let_in_when_the_other_tenant_goes_quiet() -> None:
    share = CallShare(width=2, recent_s=0.1)
    a_end = await share.turn("a", 4)
    b_end = await share.turn("b", None)
    b_end()
    waiting = [asyncio.ensure_future(share.turn("a", 4)) for _ in range(3)]
    await asyncio.sleep(0)
    assert share.waiting("a") == 3  # A holds its share (one) while B counts as active
    ends = await asyncio.wait_for(asyncio.gather(*waiting), 2)  # nothing ends: the window's end lets them in
    assert share.running("a") == 4
    for end in [a_end, *ends]:
        end()


async def test_a_cancelled_waiting_call_leaves_the_queue_at_once() -> None:
    share = CallShare(width=2)
    a_end = await share.turn("a", 8)
    b_end = await share.turn("b", None)
    first = asyncio.ensure_future(share.turn("a", 8))
    second = asyncio.ensure_future(share.turn("a", 8))
    await asyncio.sleep(0)
    assert share.waiting("a") == 2
    first.cancel()
    await asyncio.sleep(0)
    assert share.waiting("a") == 1
    with pytest.raises(asyncio.CancelledError):
        await first
    a_end()
    second_end = await asyncio.wait_for(second, 1)  # the turn went to the call behind the cancelled one
    assert share.running("a") == 1
    second_end()
    b_end()


async def test_a_turn_ended_twice_counts_once() -> None:
    share = CallShare(width=2)
    end = await share.turn("a", 2)
    end()
    end()
    assert share.running("a") == 0


async def test_the_busy_tenant_is_not_starved_and_runs_first_in_first_out() -> None:
    share = CallShare(width=2)
    order: list[str] = []

    async def call(tenant: str, name: str) -> None:
        end = await share.turn(tenant, 4)
        order.append(name)
        await asyncio.sleep(0.001)
        end()

    async def sequential(tenant: str, n: int) -> None:
        for i in range(n):
            await call(tenant, f"{tenant}{i}")

    # A keeps four workers calling; B calls one after another all the time: A still runs (at its share, one).
    a_calls = [call("a", f"a{i}") for i in range(12)]
    await asyncio.wait_for(asyncio.gather(sequential("b", 12), *a_calls), 5)
    assert [n for n in order if n[0] == "a"] == [f"a{i}" for i in range(12)]
    assert [n for n in order if n[0] == "b"] == [f"b{i}" for i in range(12)]
    assert share.waiting() == 0


async def test_quota_slots_wait_for_their_turn_and_refusals_stay_refusals() -> None:
    async def none(_: str) -> list[object]:
        return []

    quotas = TenantQuotas(none, configured={"a": Quota(calls=3)})  # type: ignore[arg-type]
    quotas.call_share = CallShare(width=2)
    a_slots = [await quotas.admit_call("a") for _ in range(2)]
    b_slot = await quotas.admit_call("b")
    waiting = asyncio.ensure_future(quotas.admit_call("a"))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert quotas.running("a").calls == 3  # a waiting call holds its quota slot
    with pytest.raises(QuotaExceededError):
        await quotas.admit_call("a")  # beyond the quota: refused, not queued
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert quotas.running("a").calls == 2  # the cancelled call gave its slot back
    for slot in [*a_slots, b_slot]:
        slot.release()
    assert quotas.call_share.running("a") == quotas.call_share.running("b") == 0


async def test_a_long_call_stops_holding_its_tenants_share() -> None:
    clock = Clock()
    share = CallShare(width=2, recent_s=1.5, long_s=2.0, clock=clock)
    server = await share.turn("a", 4)  # a long command of A's (a build, a server)
    b_end = await share.turn("b", None)
    assert share.share("a", 4) == 1
    assert share.counted("a") == 1
    clock.now += 2.0
    assert share.counted("a") == 0  # still running, no longer counted against A's share
    a_next = await asyncio.wait_for(share.turn("a", 4), 1)  # so A's next call runs beside it though B calls
    assert share.running("a") == 2
    for end in (a_next, b_end, server):
        end()


async def test_a_tenant_with_only_a_long_call_does_not_hold_others_to_a_share() -> None:
    clock = Clock()
    share = CallShare(width=2, recent_s=1.5, long_s=2.0, clock=clock)
    server = await share.turn("b", None)
    clock.now += 2.0
    assert share.share("a", 4) == 4  # B runs one long call and starts nothing: A is alone in calling
    ends = await asyncio.wait_for(_turns(share, "a", 4, 4), 1)
    for end in [*ends, server]:
        end()


async def test_a_waiting_call_is_let_in_when_a_running_one_turns_long() -> None:
    share = CallShare(width=2, recent_s=5.0, long_s=0.1)
    long = await share.turn("a", 4)
    b_end = await share.turn("b", None)
    waiting = asyncio.ensure_future(share.turn("a", 4))
    await asyncio.sleep(0)
    assert share.waiting("a") == 1
    a_next = await asyncio.wait_for(waiting, 2)  # nothing ended: A's first call turning long let it in
    for end in (a_next, b_end, long):
        end()
