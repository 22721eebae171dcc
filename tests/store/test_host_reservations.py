"""Host reservations in the store (core/sessions/capacity.ReservationBook), against SQLite and PostgreSQL: two
control planes' ledgers on one store and one host never reserve more than the host has, the last slot goes
to exactly one of two racing planes, and a plane whose lease ran out stops counting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from controlplane.core.sessions.capacity import Claim, HostCapacity, HostLedger, Reservation
from controlplane.errors import ResourceExhaustedError
from controlplane.store.base import Store, open_store

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
Opener = Callable[[], Awaitable[Store]]
RESERVE = Reservation(cpu=0.1, memory_mb=64)


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite://{tmp_path / 'shared.db'}"


@pytest.fixture
async def stores(url: str, tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on the same data, one per control plane (two connections, as two processes have)."""
    a, b = await open_store(url, tmp_path), await open_store(url, tmp_path)
    yield a, b
    await a.aclose()
    await b.aclose()


def ledger(store: Store, plane: str, slots: int, *, host: str = "engine:one", pooled: int = 0,
           clock: Callable[[], float] | None = None, lease_s: float = 30.0) -> HostLedger:
    capacity = HostCapacity(cpu=100.0, memory_mb=slots * RESERVE.memory_mb)
    return HostLedger(capacity, RESERVE, pooled, book=store, host=host, plane=plane, lease_s=lease_s,
                      clock=clock or time.time)


async def create(host: HostLedger, session_id: str) -> None:
    async with host.admitting() as keep:
        await keep(session_id)


async def test_two_planes_on_one_host_share_its_capacity(stores: tuple[Store, Store]) -> None:
    a, b = ledger(stores[0], "plane-a", 4, pooled=1), ledger(stores[1], "plane-b", 4)
    await a.start()
    await b.start()
    try:
        await create(a, "ses_a1")
        await create(b, "ses_b1")
        await create(b, "ses_b2")  # the 4th: plane a's pool, its session and b's two
        with pytest.raises(ResourceExhaustedError) as refused:
            await create(a, "ses_a2")
        assert str(refused.value) == (
            "the host is full: 4 sessions reserve 256 of its 256 MiB of memory (resources.reserve.memory_mb 64 each)"
        )
        with pytest.raises(ResourceExhaustedError):
            await create(b, "ses_b3")
        seen_by_a, seen_by_b = await a.reserved(), await b.reserved()
        assert seen_by_a == seen_by_b
        assert (seen_by_a.slots, round(seen_by_a.cpu, 6), seen_by_a.memory_mb, seen_by_a.disk_mb) == (4, 0.4, 256, 0)
        await b.release("ses_a1")  # a session is released by whichever plane ends it
        await create(b, "ses_b3")
        # Another host's reservations are its own.
        other = ledger(stores[1], "plane-b", 1, host="engine:two")
        await other.start()
        await create(other, "ses_elsewhere")
        await other.close()
    finally:
        await a.close()
        await b.close()


async def test_two_planes_racing_for_the_last_slot_get_it_once(stores: tuple[Store, Store]) -> None:
    a, b = ledger(stores[0], "plane-a", 5), ledger(stores[1], "plane-b", 5)
    await a.start()
    await b.start()
    try:
        for i in range(4):
            await create(a if i % 2 else b, f"ses_{i}")
        for round_ in range(3):  # the last slot, taken by twelve creates at once, six per plane
            results = await asyncio.gather(
                *(create(a if i % 2 else b, f"ses_r{round_}_{i}") for i in range(12)), return_exceptions=True,
            )
            won = [r for r in results if r is None]
            assert len(won) == 1, results
            assert all(isinstance(r, ResourceExhaustedError) for r in results if r is not None)
            assert (await a.reserved()).slots == 5
            await a.release(f"ses_r{round_}_{results.index(None)}")
    finally:
        await a.close()
        await b.close()


async def test_a_plane_whose_lease_ran_out_stops_counting_and_puts_its_reservations_again(
    stores: tuple[Store, Store],
) -> None:
    now = [1000.0]
    a = ledger(stores[0], "plane-a", 3, clock=lambda: now[0], lease_s=10.0)
    b = ledger(stores[1], "plane-b", 3, clock=lambda: now[0], lease_s=100.0)
    await a.start(["ses_adopted"])
    await b.start()
    await create(a, "ses_a1")
    await create(a, "ses_a2")
    with pytest.raises(ResourceExhaustedError):
        await create(b, "ses_b1")
    await a.close()  # its heartbeat stops: as if it had died
    now[0] += 9.0
    with pytest.raises(ResourceExhaustedError):  # still within plane a's lease
        await create(b, "ses_b1")
    now[0] += 2.0
    await create(b, "ses_b1")  # plane a's lease ran out: its three reservations are forgotten
    assert (await b.reserved()).slots == 1
    # A plane that was only stalled finds out at its next renewal and puts what it holds again.
    assert not await stores[0].renew_host_lease("engine:one", "plane-a", now[0], 10.0)
    await stores[0].put_host_reservations("engine:one", "plane-a", [
        Claim("engine:one", "plane-a", "ses_adopted", 1, RESERVE.cpu, RESERVE.memory_mb),
    ], now[0], 10.0)
    assert (await b.reserved()).slots == 2
    assert await stores[0].renew_host_lease("engine:one", "plane-a", now[0] + 5, 10.0)
    await b.close()


async def test_a_restarted_plane_replaces_what_it_held_with_what_it_adopted(stores: tuple[Store, Store]) -> None:
    first = ledger(stores[0], "plane-a", 10, pooled=2)
    await first.start()
    for i in range(3):
        await create(first, f"ses_{i}")
    await first.close()  # its pool goes; its sessions stay reserved for a restart to adopt
    assert (await first.reserved()).slots == 3
    again = ledger(stores[1], "plane-a", 10, pooled=2)
    await again.start(["ses_1"])  # the others were lost while it was down
    assert (await again.reserved()).slots == 3  # its new pool of two and the one it adopted
    await again.close()


async def test_a_create_that_fails_or_is_cancelled_gives_its_slot_back(stores: tuple[Store, Store]) -> None:
    a = ledger(stores[0], "plane-a", 2)
    await a.start()
    with pytest.raises(RuntimeError):
        async with a.admitting():
            raise RuntimeError("the sandbox did not start")
    started = asyncio.Event()

    async def slow_create() -> None:
        async with a.admitting():
            started.set()
            await asyncio.sleep(60)

    task = asyncio.get_running_loop().create_task(slow_create())
    await started.wait()
    assert (await a.reserved()).slots == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await a.reserved()).slots == 0
    await a.close()
