"""Host admission: what every session reserves, summed, never exceeds what the host has.

A session's limits (cpu, memory_mb) are what it may use and may over-commit the host, as idle sessions
use almost nothing; its reservation is what it is promised. Admission refuses the session whose
reservation would take the sum past the host's capacity, and `bounded_maximum` keeps any one
session's limits within the host's total, so a request the engine could never honour is refused by the
platform with the limit named instead of failing at the engine. Warm pool sandboxes hold a reservation
each from the start (they exist and are handed to sessions as they are), so the pool is a fixed base.

Several control planes may run sandboxes on one host (sharing a store and a Docker engine): the
reservations live in a `ReservationBook`, the store's when there is one, keyed by the host's identity, so
each plane's check counts every plane's sessions, creates in flight and pools. The store checks and takes
a reservation in one transaction (two planes racing for the last slot cannot both get it). Each plane's
reservations hang on its lease, renewed by a heartbeat: a plane that dies without a word stops counting
once its lease runs out, and one that restarts replaces what it held with the sessions it adopts.

Disk is counted by use: what sessions wrote is already gone from the filesystem's free space, so the
check is that the free space, less `disk_reserve_mb` and what creates in flight have claimed, still holds
the new session's need (its image's metadata and its first write, see host_capacity.disk_need_mb).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from controlplane.core.sessions.models import Resources
from controlplane.errors import ResourceExhaustedError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reservation:
    cpu: float = 0.005
    """An idle session (agent, tool hosts) uses well under half a percent of a CPU; 200 sessions per CPU
    (0.05 would stop a 2-CPU host at 40 idle sessions)."""
    memory_mb: int = 64


@dataclass(frozen=True)
class HostCapacity:
    cpu: float
    memory_mb: int


@dataclass(frozen=True)
class DiskRule:
    """Free space on the filesystem that holds the data dir (workspace images, the store, socket dirs)."""

    free_mb: Callable[[], int]
    """Measured at each create (statvfs): what sessions wrote is counted there."""
    reserve_mb: int
    """Kept free for the host (`host.disk_reserve_mb`)."""
    image_mb: int = 0
    """What a new session's workspace image takes on the host soon after it is made, whatever it holds."""


@dataclass(frozen=True)
class Claim:
    """One row of the book: a session's (or create's, or a pool's) reservation on `host`, held by `plane`."""

    host: str
    plane: str
    holder: str
    """A session id, `create:<random>` while a create runs, `pool:<plane>` for a plane's warm pool."""
    slots: int
    cpu: float
    memory_mb: int
    disk_mb: int = 0
    """Disk a create in flight will write soon (its image and first write); 0 once it exists, as its use
    then shows in the free space."""


@dataclass(frozen=True)
class HostUse:
    """The sum of the live reservations on one host."""

    slots: int = 0
    cpu: float = 0.0
    memory_mb: int = 0
    disk_mb: int = 0


class ReservationBook(Protocol):
    """Where reservations are kept; the store implements it for every plane that shares it."""

    async def take_host_reservation(self, claim: Claim, now: float, lease_s: float,
                                    check: Callable[[HostUse], None]) -> None:
        """In one transaction, against every other plane's: forgets the reservations of planes whose lease
        ran out on `claim.host`, calls `check` with the sum of the rest (it raises to refuse: nothing
        changes), then adds `claim`. The lease is renewed only by `renew_host_lease` and `put_host_reservations`,
        so a plane whose lease ran out finds out (and puts its reservations again) at its next heartbeat."""
        ...

    async def put_host_reservations(self, host: str, plane: str, claims: list[Claim], now: float,
                                    lease_s: float) -> None:
        """Replaces every reservation `plane` holds on `host` with `claims`, never refused; renews its lease."""
        ...

    async def keep_host_reservation(self, holder: str, claim: Claim) -> None:
        """Replaces the reservation `holder` with `claim` (a create's with its session's), never refused: it is
        the same reservation, and the first may be gone if the plane's lease ran out meanwhile."""
        ...

    async def drop_host_reservation(self, holder: str) -> None: ...

    async def host_use(self, host: str, now: float) -> HostUse:
        """The sum of the reservations on `host` whose plane's lease is live."""
        ...

    async def renew_host_lease(self, host: str, plane: str, now: float, lease_s: float) -> bool:
        """False when the lease had run out (its reservations may be gone): the plane puts them again."""
        ...


class MemoryBook:
    """The book of one plane without a shared store (and of unit tests): a dict."""

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}

    async def take_host_reservation(self, claim: Claim, now: float, lease_s: float,
                                    check: Callable[[HostUse], None]) -> None:
        check(_sum(c for c in self.claims.values() if c.host == claim.host))
        self.claims[claim.holder] = claim

    async def put_host_reservations(self, host: str, plane: str, claims: list[Claim], now: float,
                                    lease_s: float) -> None:
        self.claims = {h: c for h, c in self.claims.items() if (c.host, c.plane) != (host, plane)}
        self.claims.update((c.holder, c) for c in claims)

    async def keep_host_reservation(self, holder: str, claim: Claim) -> None:
        self.claims.pop(holder, None)
        self.claims[claim.holder] = claim

    async def drop_host_reservation(self, holder: str) -> None:
        self.claims.pop(holder, None)

    async def host_use(self, host: str, now: float) -> HostUse:
        return _sum(c for c in self.claims.values() if c.host == host)

    async def renew_host_lease(self, host: str, plane: str, now: float, lease_s: float) -> bool:
        return True


def _sum(claims: Iterable[Claim]) -> HostUse:
    use = HostUse()
    for c in claims:
        use = HostUse(use.slots + c.slots, use.cpu + c.cpu, use.memory_mb + c.memory_mb, use.disk_mb + c.disk_mb)
    return use


def bounded_maximum(maximum: Resources, host: HostCapacity) -> Resources:
    """The most one session may ask for: the configured maximum, never more than the host's total."""
    return Resources(min(maximum.cpu, host.cpu), min(maximum.memory_mb, host.memory_mb), maximum.pids)


class HostLedger:
    """Reservations of live sessions, creates in flight and the warm pool, against the host's capacity."""

    def __init__(
        self, capacity: HostCapacity, reserve: Reservation = Reservation(), pooled: int = 0, *,
        book: ReservationBook | None = None, host: str = "host", plane: str = "plane", lease_s: float = 30.0,
        disk: DiskRule | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        self.capacity = capacity
        self.reserve = reserve
        self.book: ReservationBook = book or MemoryBook()
        self.host = host
        self.plane = plane
        self.lease_s = lease_s
        self.disk = disk
        self._pooled = pooled
        self._clock = clock
        self._held: set[str] = set()
        """This plane's sessions: put again if its lease ran out while it was alive (a long stall)."""
        self._heartbeat: asyncio.Task[None] | None = None
        self._to_drop: set[str] = set()
        """Sessions ended while the store was away: their reservations are dropped at the next renewal."""
        if isinstance(self.book, MemoryBook):  # alone on the host: the pool counts from the start, as it exists
            self.book.claims.update((c.holder, c) for c in self._base())

    def _claim(self, holder: str, slots: int = 1, disk_mb: int = 0) -> Claim:
        return Claim(self.host, self.plane, holder, slots, slots * self.reserve.cpu, slots * self.reserve.memory_mb,
                     disk_mb)

    def _base(self) -> list[Claim]:
        pool = [self._claim(f"pool:{self.plane}", self._pooled)] if self._pooled else []
        return pool + [self._claim(s) for s in sorted(self._held)]

    async def start(self, adopted: Iterable[str] = ()) -> None:
        """Replaces what this plane held before (a restart) with its pool and the sessions it adopted, and
        starts renewing its lease."""
        self._held = set(adopted)
        await self.book.put_host_reservations(self.host, self.plane, self._base(), self._clock(), self.lease_s)
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._renew_loop())

    async def close(self) -> None:
        """Stops renewing; the pool goes with the plane, its sessions' reservations stay until their lease
        runs out or a restart adopts them."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        with contextlib.suppress(Exception):
            await self.book.drop_host_reservation(f"pool:{self.plane}")

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                for holder in sorted(self._to_drop):
                    await self.book.drop_host_reservation(holder)
                    self._to_drop.discard(holder)
                if not await self.book.renew_host_lease(self.host, self.plane, self._clock(), self.lease_s):
                    log.warning("host admission: this plane's lease had run out; its reservations are put again")
                    await self.book.put_host_reservations(self.host, self.plane, self._base(), self._clock(),
                                                          self.lease_s)
            except Exception as exc:  # the store is away for a moment: the next round tries again
                log.warning("host admission: renewing this plane's lease failed: %s", exc)

    def _check(self, use: HostUse, disk_mb: int, free_mb: int | None) -> None:
        if use.cpu + self.reserve.cpu > self.capacity.cpu + 1e-9:
            raise ResourceExhaustedError(
                f"the host is full: {use.slots} sessions reserve {use.cpu:g} of its "
                f"{self.capacity.cpu:g} CPUs (resources.reserve.cpu {self.reserve.cpu:g} each)"
            )
        if use.memory_mb + self.reserve.memory_mb > self.capacity.memory_mb:
            raise ResourceExhaustedError(
                f"the host is full: {use.slots} sessions reserve {use.memory_mb} of its "
                f"{self.capacity.memory_mb} MiB of memory (resources.reserve.memory_mb {self.reserve.memory_mb} each)"
            )
        if self.disk is not None and free_mb is not None:
            left = free_mb - self.disk.reserve_mb - use.disk_mb
            if disk_mb > left:
                raise ResourceExhaustedError(
                    f"the host's disk is full: a new session needs {disk_mb} MiB (its workspace image and first "
                    f"write) and the data dir's filesystem has {free_mb} MiB free, of which host.disk_reserve_mb "
                    f"keeps {self.disk.reserve_mb} and creates in flight claim {use.disk_mb}"
                )

    @contextlib.asynccontextmanager
    async def admitting(self, first_write_bytes: int = 0) -> AsyncIterator[Callable[[str], Awaitable[None]]]:
        """A reservation for one create while it runs; the function it gives keeps it for a session id
        (until `release`). RESOURCE_EXHAUSTED, naming the use and the capacity, when the host is full.
        `first_write_bytes`: what the create writes into the workspace at once (its archive)."""
        disk_mb = 0
        free_mb = None
        if self.disk is not None:
            disk_mb = self.disk.image_mb + -(-first_write_bytes // (1 << 20))
            free_mb = await asyncio.to_thread(self.disk.free_mb)
        holder = "create:" + secrets.token_hex(8)
        await self.book.take_host_reservation(
            self._claim(holder, disk_mb=disk_mb), self._clock(), self.lease_s,
            lambda use: self._check(use, disk_mb, free_mb),
        )
        kept: list[str] = []

        async def keep(session_id: str) -> None:
            await self.book.keep_host_reservation(holder, self._claim(session_id))
            self._held.add(session_id)
            kept.append(session_id)

        try:
            yield keep
        finally:
            if not kept:  # shielded: a cancelled create must not leave its claim to the lease
                await asyncio.shield(self.book.drop_host_reservation(holder))

    async def release(self, session_id: str) -> None:
        """Ends a session's reservation, whichever plane holds it (the holder is the session's id). Never
        raises: a session ends even with the store away for a moment; the heartbeat drops it later."""
        self._held.discard(session_id)
        try:
            await self.book.drop_host_reservation(session_id)
        except Exception as exc:
            self._to_drop.add(session_id)
            log.warning("host admission: releasing session %s failed, tried again later: %s", session_id, exc)

    async def reserved(self) -> HostUse:
        """What the live reservations on this host sum to, every plane's."""
        return await self.book.host_use(self.host, self._clock())
