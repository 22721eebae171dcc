"""Host admission: what every session reserves, summed, never exceeds what the host has.

A session's limits (cpu, memory_mb) are what it may use and may over-commit the host, as idle sessions
use almost nothing; its reservation is what it is promised. Admission refuses the session whose
reservation would take the sum past the host's capacity, and `bounded_maximum` keeps any one
session's limits within the host's total, so a request the engine could never honour is refused by the
platform with the limit named instead of failing at the engine. Warm pool sandboxes hold a reservation
each from the start (they exist and are handed to sessions as they are), so the pool is a fixed base.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from controlplane.core.sessions.models import Resources
from controlplane.errors import ResourceExhaustedError


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


def bounded_maximum(maximum: Resources, host: HostCapacity) -> Resources:
    """The most one session may ask for: the configured maximum, never more than the host's total."""
    return Resources(min(maximum.cpu, host.cpu), min(maximum.memory_mb, host.memory_mb), maximum.pids)


class HostLedger:
    """Reservations of live sessions, creates in flight and the warm pool, against the host's capacity."""

    def __init__(self, capacity: HostCapacity, reserve: Reservation = Reservation(), pooled: int = 0) -> None:
        self.capacity = capacity
        self.reserve = reserve
        self._pooled = pooled
        self._held: set[str] = set()
        self._in_flight = 0

    @property
    def reserved(self) -> int:
        """How many reservations are taken."""
        return self._pooled + len(self._held) + self._in_flight

    def _check(self) -> None:
        n = self.reserved + 1
        cpu, memory = n * self.reserve.cpu, n * self.reserve.memory_mb
        if cpu > self.capacity.cpu + 1e-9:
            raise ResourceExhaustedError(
                f"the host is full: {self.reserved} sessions reserve {self.reserved * self.reserve.cpu:g} of its "
                f"{self.capacity.cpu:g} CPUs (resources.reserve.cpu {self.reserve.cpu:g} each)"
            )
        if memory > self.capacity.memory_mb:
            raise ResourceExhaustedError(
                f"the host is full: {self.reserved} sessions reserve {self.reserved * self.reserve.memory_mb} of its "
                f"{self.capacity.memory_mb} MiB of memory (resources.reserve.memory_mb {self.reserve.memory_mb} each)"
            )

    @contextlib.contextmanager
    def admitting(self) -> Iterator[Callable[[str], None]]:
        """A reservation for one create while it runs; the function it gives keeps it for a session id
        (until `release`). RESOURCE_EXHAUSTED, naming the use and the capacity, when the host is full."""
        self._check()
        self._in_flight += 1
        try:
            yield self._held.add
        finally:
            self._in_flight -= 1

    def hold(self, session_id: str) -> None:
        """Counts a session that exists already (adopted after a restart): never refused."""
        self._held.add(session_id)

    def release(self, session_id: str) -> None:
        self._held.discard(session_id)
