"""A fair gate for the expensive part of creating sessions: at most `width` at once, waiters let in by tenant
in turn (round robin), so one tenant's burst of creates does not queue every other tenant's behind it.

Without it every create went to the engine at once: a tenant creating up to its quota kept four container
starts (disk image, volume, container, agent) in flight on a two-CPU host, and another tenant's single
create shared the engine and the CPUs with all of them (1.1 s alone, 8.3 s then, in the fairness bench).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairGate:
    def __init__(self, width: int) -> None:
        if width < 1:
            raise ValueError(f"a fair gate needs a width of at least 1, not {width}")
        self._width = width
        self._busy = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        """Per tenant, in the order tenants are served next; a tenant is moved to the end when one of its
        waiters is let in."""

    @property
    def busy(self) -> int:
        return self._busy

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        if self._busy < self._width and not self._waiting:
            self._busy += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._next()  # let in and cancelled at once: the slot goes to the next waiter
                else:
                    self._forget(tenant, turn)
                raise
        try:
            yield
        finally:
            self._next()

    def _forget(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(turn)
            if not queue:
                del self._waiting[tenant]

    def _next(self) -> None:
        """Hands the slot just freed to the first waiter of the next tenant in turn, or frees it."""
        while self._waiting:
            tenant, queue = next(iter(self._waiting.items()))
            turn = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            if not turn.done():
                turn.set_result(None)
                return
        self._busy -= 1
