"""How many bytes of large tool-call arguments the control plane holds at once: per tenant and in all.

A call's arguments stay in the control plane's memory for the call's whole life, and once parsed and
validated they take several times their size (an 8 MiB todo list is about 50 MiB of Python objects, twice
over after validation). Without a bound, a tenant sending many large calls at once, from many streams or
sessions, grows the plane by that much per call. Only large arguments (arguments.OFF_LOOP_BYTES and up) are
counted: small ones are bounded by the calls quota and the message size, and counting them would make a
tenant's small calls wait behind another tenant's large ones.

Past the tenant's own budget a call is refused at once (RESOURCE_EXHAUSTED, with the figures): its text is
already in memory, so making it wait would keep it there for as long as the tenant keeps sending, and the
tenant is the one that can stop. Past the global budget, a call within its tenant's budget waits its turn
(first come, first served) instead: it is not that tenant's doing, and refusing it would let one tenant make
another's calls fail. What waits is itself bounded, by each tenant's budget.
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

DEFAULT_TENANT_MB = 32
"""Four calls at the default limits.max_args_bytes (8 MiB) at once."""
DEFAULT_TOTAL_MB = 96


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


class ArgumentBudget:
    def __init__(self, tenant_bytes: int = DEFAULT_TENANT_MB << 20, total_bytes: int = DEFAULT_TOTAL_MB << 20) -> None:
        """0: no bound of that kind."""
        self.tenant_bytes = tenant_bytes
        self.total_bytes = total_bytes
        self._held: dict[str, int] = {}
        self._total = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def held_by(self, asked: A, start: Callable[[A], Awaitable[S]]) -> S:
        """`start(asked)`, holding room for its arguments until the task of what it started is done (also when
        that task is cancelled before its first step)."""
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

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    @property
    def total(self) -> int:
        return self._total

    async def take(self, tenant: str, n: int) -> Hold | None:
        """Room for `n` bytes of `tenant`'s arguments (None: too small to count); ResourceExhaustedError past
        the tenant's budget; waits past the global one."""
        if n < arguments.OFF_LOOP_BYTES:
            return None
        mine = self.held(tenant)
        if self.tenant_bytes and mine and mine + n > self.tenant_bytes:  # alone, any call max_args_bytes allows
            raise ResourceExhaustedError(
                f"tenant {tenant!r} has {mine} bytes of large tool-call arguments in running calls; this call's "
                f"{n} bytes would pass its limit of {self.tenant_bytes} bytes (limits.max_args_in_flight_mb): "
                f"wait for one to finish"
            )
        self._held[tenant] = mine + n  # counted while it waits: what waits is in memory too
        hold = Hold(self, tenant, n)
        try:
            await self._room(n)
        except BaseException:
            self._held[tenant] -= n
            if not self._held[tenant]:
                del self._held[tenant]
            raise
        return hold

    async def _room(self, n: int) -> None:
        # A call larger than the whole budget still runs, alone: max_args_bytes bounds it.
        def fits() -> bool:
            return not self.total_bytes or self._total == 0 or self._total + n <= self.total_bytes

        if not self._waiting and fits():
            self._total += n
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, waiter)
        self._waiting.append(entry)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._total -= n  # admitted just as it was cancelled: give its room back
            else:
                with contextlib.suppress(ValueError):  # _admit drops a cancelled waiter itself
                    self._waiting.remove(entry)
            self._admit()
            raise

    def _give_back(self, tenant: str, n: int) -> None:
        self._held[tenant] -= n
        if not self._held[tenant]:
            del self._held[tenant]
        self._total -= n
        self._admit()

    def _admit(self) -> None:
        """The waiting calls that fit now, in order: the first that does not fit stops the others behind it."""
        while self._waiting:
            n, waiter = self._waiting[0]
            if waiter.done():
                self._waiting.popleft()
                continue
            if self.total_bytes and self._total and self._total + n > self.total_bytes:
                return
            self._waiting.popleft()
            self._total += n
            waiter.set_result(None)
