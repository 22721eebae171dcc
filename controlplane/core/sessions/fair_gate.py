"""A fair gate for the expensive part of creating sessions: at most `width` at once, waiters let in by tenant
in turn (round robin), and no tenant holds more than its share of the slots: `per_tenant` alone, divided
among the tenants holding or waiting for slots when several do. One tenant's burst of creates neither queues
another tenant's behind it nor runs beside it at full width.

Without it every create went to the engine at once: a tenant creating up to its quota kept four container
starts (disk image, volume, container, agent) in flight on a two-CPU host, and another tenant's single
create shared the engine and the CPUs with all of them (1.1 s alone, 8.3 s then, in the fairness bench).
Turns alone still made another tenant's create wait for one of the burst's to end, and then run beside the
burst's others: 1.0 s at p50 to B's 0.47 s alone in the fairness bench, where B's create beside only one of
A's took 0.56 s. So a slot is kept that the busiest tenant cannot take (another tenant's create starts at
once), and while another tenant creates, a tenant's share shrinks, so the burst gives back the slots it
holds as its creates end (docs/performance.md, fairness). A lone tenant keeps its whole share.

A holder may ask whether another tenant waits for a slot that only the width keeps from it (`pressed`), and wait
until one does (`until_pressed`): a workspace copy whose sandbox stalls gives its slot up then (workspace_spool.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator


class FairGate:
    def __init__(self, width: int, per_tenant: int | None = None) -> None:
        if width < 1:
            raise ValueError(f"a fair gate needs a width of at least 1, not {width}")
        if per_tenant is not None and not 1 <= per_tenant <= width:
            raise ValueError(f"a fair gate's share per tenant must be between 1 and its width {width}, "
                             f"not {per_tenant}")
        self._width = width
        self._per_tenant = width if per_tenant is None else per_tenant
        self._busy = 0
        self._held: Counter[str] = Counter()
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        """Per tenant, in the order tenants are served next; a tenant is moved to the end when one of its
        waiters is let in."""
        self._changed: asyncio.Future[None] | None = None
        """Resolved at the next change of who holds or waits (`until_pressed` looks again then)."""

    @classmethod
    def for_creates(cls) -> FairGate:
        """Sized for cold creates on this host: as many as CPUs (at least two) for any one tenant, plus one
        slot kept for the others, so a lone tenant's creates run as wide as before."""
        share = max(2, os.cpu_count() or 1)
        return cls(share + 1, share)

    @property
    def per_tenant(self) -> int:
        """A lone tenant's share of the slots."""
        return self._per_tenant

    @property
    def busy(self) -> int:
        return self._busy

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def held(self, tenant: str) -> int:
        return self._held[tenant]

    def pressed(self, tenant: str) -> bool:
        """Whether another tenant waits that a slot given back now would let in: one under its share, kept out only
        by the width. A tenant waiting past its own share (or `tenant`'s own waiters) would gain nothing from it."""
        return any(t != tenant and self._held[t] < self._share(t) for t in self._waiting)

    async def until_pressed(self, tenant: str) -> None:
        """Returns once `pressed(tenant)` holds (at once if it does)."""
        while not self.pressed(tenant):
            if self._changed is None:
                self._changed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._changed)  # shared by every watcher: one's cancel must not end the others'

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        if self._busy < self._width and self._held[tenant] < self._share(tenant) and tenant not in self._waiting:
            self._busy += 1
            self._held[tenant] += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append(turn)
            self._changes()
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._leave(tenant)  # let in and cancelled at once: the slot goes to the next waiter
                else:
                    self._forget(tenant, turn)
                raise
        try:
            yield
        finally:
            self._leave(tenant)

    def _share(self, tenant: str) -> int:
        """`per_tenant` split evenly among the tenants holding or waiting for slots, this one included."""
        others = len((self._held.keys() | self._waiting.keys()) - {tenant})
        return max(1, self._per_tenant // (1 + others))

    def _forget(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(turn)
            if not queue:
                del self._waiting[tenant]
        self._fill()  # a waiter gone may have been the one in front of others that fit now

    def _leave(self, tenant: str) -> None:
        self._busy -= 1
        self._held[tenant] -= 1
        if self._held[tenant] <= 0:
            del self._held[tenant]
        self._fill()

    def _changes(self) -> None:
        if self._changed is not None:
            if not self._changed.done():
                self._changed.set_result(None)
            self._changed = None

    def _fill(self) -> None:
        """Hands free slots to the first waiter of each tenant in turn that is under its share."""
        self._changes()  # called after every change of who holds or waits
        while self._busy < self._width:
            tenant = next((t for t in self._waiting if self._held[t] < self._share(t)), None)
            if tenant is None:
                return
            queue = self._waiting[tenant]
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            if not turn.done():
                self._busy += 1
                self._held[tenant] += 1
                turn.set_result(None)
