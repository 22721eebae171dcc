"""The refusal schedule (controlplane.core.tenants.refusals): a tenant's refusals leave at its budget a second,
however many it has, another tenant's are not held behind them, and what is held is bounded."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.tenants.refusals import RefusalGate
from controlplane.rpc.auth import peer_host

PAUSE = 0.05
RATE = 50.0
BURST = 4


async def _answered_at(gate: RefusalGate, tenant: str, n: int, request_bytes: int = 0) -> list[float]:
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def one() -> float:
        await gate.hold(tenant, request_bytes)
        return loop.time() - started

    return sorted(await asyncio.gather(*(one() for _ in range(n))))


async def test_many_refusals_at_once_leave_at_the_rate_not_all_at_once() -> None:
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST)
    took = await _answered_at(gate, "flood", 40)
    assert all(t >= PAUSE * 0.9 for t in took)
    # By any moment, at most the burst plus the rate's share since the pause have been answered.
    for i, t in enumerate(took):
        assert i + 1 <= BURST + (t - PAUSE) * RATE + 1, (i, t)
    assert took[-1] >= PAUSE + (40 - BURST) / RATE * 0.9


async def test_a_retry_loop_is_held_at_every_refusal() -> None:
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(5):
        await gate.hold("loop")
    assert loop.time() - started >= 5 * PAUSE * 0.9


async def test_another_tenants_refusal_is_not_held_behind_a_flood() -> None:
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST)
    flood = asyncio.ensure_future(_answered_at(gate, "flood", 60))
    await asyncio.sleep(PAUSE / 2)
    assert gate.held("flood")[0] == 60
    quiet = await _answered_at(gate, "quiet", 1)
    assert quiet[0] < PAUSE * 1.8
    assert not flood.done()
    await flood


async def test_past_the_held_bound_a_refusal_is_answered_at_once_and_counted() -> None:
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST, max_held=10)
    took = await _answered_at(gate, "flood", 13)
    assert sum(t < PAUSE / 2 for t in took) == 3
    assert gate.answered_at_once("flood") == 3
    assert gate.held("flood") == (0, 0)


async def test_held_request_bytes_are_bounded() -> None:
    """A refused CreateSession keeps its archive while held: past the byte bound it is not held."""
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST, max_held_bytes=100)
    waiting = [asyncio.ensure_future(gate.hold("big", 40)) for _ in range(2)]
    await asyncio.sleep(0)
    assert gate.held("big") == (2, 80)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gate.hold("big", 40)  # 120 bytes would be held: answered at once
    assert loop.time() - started < PAUSE / 2
    await gate.hold("big", 0)  # a refusal that keeps nothing is still held
    assert loop.time() - started >= PAUSE * 0.9
    await asyncio.gather(*waiting)
    assert gate.held("big") == (0, 0)


async def test_a_cancelled_hold_gives_back_what_it_held() -> None:
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST)
    task = asyncio.ensure_future(gate.hold("gone", 1000))
    await asyncio.sleep(0)
    assert gate.held("gone") == (1, 1000)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gate.held("gone") == (0, 0)
    gate.forget("gone")
    assert gate.answered_at_once("gone") == 0


async def test_a_gate_keyed_by_client_address_keeps_no_schedule_once_its_refusals_are_over() -> None:
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST, max_held_bytes=100, forget_idle=True)
    await asyncio.gather(*(gate.hold(f"ipv4:10.0.0.{i}") for i in range(50)), gate.hold("ipv4:10.0.1.1", 1000))
    assert gate.answered_at_once("ipv4:10.0.1.1") == 0  # answered at once, and not kept either
    await _answered_at(gate, "ipv4:10.0.0.1", 3 * BURST)
    await asyncio.sleep(3 * BURST / RATE)
    await asyncio.gather(gate.hold("ipv4:10.0.0.2"), gate.hold("ipv4:10.0.0.3"))
    assert gate.held("ipv4:10.0.0.1") == (0, 0)
    assert gate.kept() == 0
    # Dropped only when a new schedule would be the same: a loop's refusals still leave at the rate.
    took = await _answered_at(gate, "ipv4:10.0.0.3", 20)
    for i, t in enumerate(took):
        assert i + 1 <= BURST + (t - PAUSE) * RATE + 1, (i, t)


def test_a_schedule_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError, match="rate"):
        RefusalGate(rate=0)


async def test_keys_without_a_closed_set_are_bounded_together() -> None:
    """Client addresses: a client with many of them held each one's bound (8 addresses, +209 MiB)."""
    gate = RefusalGate(pause_s=PAUSE, rate=RATE, burst=BURST, max_held_bytes=300, max_total_bytes=500,
                       forget_idle=True)
    loop = asyncio.get_running_loop()
    first = [asyncio.ensure_future(gate.hold(f"ipv4:10.0.0.{i}", 200)) for i in range(2)]
    await asyncio.sleep(0)
    assert gate.total_bytes() == 400
    asked = loop.time()
    await gate.hold("ipv4:10.0.0.9", 200)  # under its own address's bound, past all of them together
    assert loop.time() - asked < PAUSE / 2
    await asyncio.gather(*first)
    assert gate.total_bytes() == 0
    took = await _answered_at(gate, "ipv4:10.0.0.9", 1, 200)  # with room again, held as before
    assert took[0] >= PAUSE * 0.9


@pytest.mark.parametrize(("peer", "key"), [
    ("ipv4:10.0.0.1:5000", "ipv4:10.0.0.1"),
    ("ipv6:[2001:db8:1:2:3:4:5:6]:443", "ipv6:2001:db8:1:2::/64"),
    ("ipv6:%5B2001:db8:1:2:ffff::9%5D:443", "ipv6:2001:db8:1:2::/64"),
    ("ipv6:[::ffff:10.1.2.3]:9", "ipv4:10.1.2.3"),
    ("unix:/run/plane.sock", "unix:/run/plane.sock"),
])
def test_a_client_is_known_by_what_it_cannot_multiply(peer: str, key: str) -> None:
    """An IPv6 client is commonly given a /64; a dual-stack listener's IPv4 clients are each their own."""
    assert peer_host(peer) == key
