"""How many bytes of large tool-call arguments the control plane holds at once: per tenant and in all.

A call's arguments stay in the control plane's memory for the call's whole life, and once parsed and
validated they take many times their size (an 8 MiB list of small todo items: about 190 MiB at the call's
peak, between the parsed arguments, their validated copy and the result). Without a bound, a tenant sending
many large calls at once, from many streams or sessions, grows the plane by that much per call. Only large
arguments (arguments.OFF_LOOP_BYTES and up) are counted: small ones are bounded by the calls quota and the
message size, and counting them would make a tenant's small calls wait behind another tenant's large ones.

A call runs when its tenant's running calls and all running calls leave room for it; until then it waits.
Waiting keeps only the arguments' text (a few times smaller than a running call), and a waiting client
sends nothing more, where a refused one would send its arguments again at once (each a receive and a
decode of megabytes on the plane). Waiting is bounded too: past the tenant's queue budget a call is
refused (RESOURCE_EXHAUSTED, with the figures). A waiter whose own tenant is full does not hold back
another tenant's, and when room comes back the tenant with the least running goes first: a tenant's queue
does not put it ahead of another tenant, however many calls it sends.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from controlplane.core.calls import arguments
from controlplane.errors import ResourceExhaustedError

DEFAULT_TENANT_MB = 8
"""One call at the default limits.max_args_bytes (8 MiB) at a time per tenant, or several smaller ones."""
DEFAULT_QUEUED_MB = 32
DEFAULT_TOTAL_MB = 24


class Started(Protocol):
    @property
    def task(self) -> asyncio.Future[Any] | None: ...


class Asked(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def args_json(self) -> str: ...


S = TypeVar("S", bound=Started)
A = TypeVar("A", bound=Asked)


@dataclass
class Hold:
    """What one call holds of the budget, given back once by `release` (a second call does nothing)."""

    budget: ArgumentBudget
    tenant: str
    n: int
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.budget._give_back(self.tenant, self.n)


class _Waiter:
    def __init__(self, tenant: str, n: int) -> None:
        self.tenant = tenant
        self.n = n
        self.admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class ArgumentBudget:
    def __init__(
        self, tenant_bytes: int = DEFAULT_TENANT_MB << 20, queued_bytes: int = DEFAULT_QUEUED_MB << 20,
        total_bytes: int = DEFAULT_TOTAL_MB << 20,
    ) -> None:
        """0: no bound of that kind."""
        self.tenant_bytes = tenant_bytes
        self.queued_bytes = queued_bytes
        self.total_bytes = total_bytes
        self._running: dict[str, int] = {}
        self._queued: dict[str, int] = {}
        self._total = 0
        self._waiting: collections.deque[_Waiter] = collections.deque()

    async def held_by(self, asked: A, start: Callable[[A], Awaitable[S]]) -> S:
        """`start(asked)` once there is room for its arguments, held until the task of what it started is done
        (also when that task is cancelled before its first step)."""
        tenant, args_json = asked.tenant, asked.args_json
        n = arguments.size(args_json) if len(args_json) >= arguments.OFF_LOOP_BYTES else 0
        hold = await self.take(tenant, n)
        if hold is None:
            return await start(asked)
        try:
            started = await start(asked)
        except BaseException:
            hold.release()
            raise
        if started.task is None:
            hold.release()
        else:
            started.task.add_done_callback(lambda _: hold.release())
        return started

    def running(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    def queued(self, tenant: str) -> int:
        return self._queued.get(tenant, 0)

    @property
    def total(self) -> int:
        return self._total

    async def take(self, tenant: str, n: int) -> Hold | None:
        """Room for `n` bytes of `tenant`'s arguments, once there is (None: too small to count);
        ResourceExhaustedError when the tenant's waiting calls already hold its queue budget."""
        if n < arguments.OFF_LOOP_BYTES:
            return None
        if not self._waiting and self._fits(tenant, n):  # the common case: nobody waits, room for it
            self._add(self._running, tenant, n)
            self._total += n
            return Hold(self, tenant, n)
        queued = self.queued(tenant)
        if self.queued_bytes and queued and queued + n > self.queued_bytes:
            raise ResourceExhaustedError(
                f"tenant {tenant!r} has {self.running(tenant)} bytes of large tool-call arguments in running "
                f"calls (limit {self.tenant_bytes}, limits.max_args_in_flight_mb) and {queued} bytes waiting; "
                f"this call's {n} bytes would pass the limit of {self.queued_bytes} bytes waiting "
                f"(limits.max_args_queued_mb): wait for a call to finish"
            )
        waiter = _Waiter(tenant, n)
        self._add(self._queued, tenant, n)
        self._waiting.append(waiter)
        self._admit()
        try:
            await waiter.admitted
        except BaseException:
            if waiter.admitted.done() and not waiter.admitted.cancelled():
                self._give_back(tenant, n)  # let in just as it was cancelled
            else:
                self._add(self._queued, tenant, -n)
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
                self._admit()
            raise
        return Hold(self, tenant, n)

    def _fits(self, tenant: str, n: int) -> bool:
        if self._tenant_full(tenant, n):
            return False
        return not self.total_bytes or not self._total or self._total + n <= self.total_bytes

    @staticmethod
    def _add(counts: dict[str, int], tenant: str, n: int) -> None:
        counts[tenant] = counts.get(tenant, 0) + n
        if not counts[tenant]:
            del counts[tenant]

    def _give_back(self, tenant: str, n: int) -> None:
        self._add(self._running, tenant, -n)
        self._total -= n
        self._admit()

    def _admit(self) -> None:
        """Waiting calls with room now. One whose tenant is full is passed over (its turn comes when one of its
        tenant's calls ends); among the others, the tenant with the least running goes first (in order of
        arrival between equals), and when that one does not fit in the total, nobody behind it goes either,
        so a large call is not overtaken for ever by smaller ones."""
        while True:
            self._waiting = collections.deque(w for w in self._waiting if not w.admitted.done())
            eligible, seen = [], set()
            for waiter in self._waiting:  # a tenant's calls in their order: only its first waiter may go
                if waiter.tenant not in seen and not self._tenant_full(waiter.tenant, waiter.n):
                    eligible.append(waiter)
                seen.add(waiter.tenant)
            if not eligible:
                return
            chosen = min(eligible, key=lambda w: self.running(w.tenant))  # the first of equals: min is stable
            if self.total_bytes and self._total and self._total + chosen.n > self.total_bytes:
                return
            self._waiting.remove(chosen)
            self._add(self._queued, chosen.tenant, -chosen.n)
            self._add(self._running, chosen.tenant, chosen.n)
            self._total += chosen.n
            chosen.admitted.set_result(None)

    def _tenant_full(self, tenant: str, n: int) -> bool:
        # A call alone always runs, however large: max_args_bytes bounds it, not these.
        mine = self.running(tenant)
        return bool(self.tenant_bytes and mine and mine + n > self.tenant_bytes)
