"""One turn per tenant for every check-then-store of its kept workspaces (taken, paused and retained snapshots).

Each such act counts what the tenant keeps (snapshots.max_per_tenant, the disk quota), then stores one more: two
of them at once would both pass the count. SnapshotSession, PauseSession, DeleteSession(keep_snapshot) and an
ending session's retention all take the tenant's turn from this one object, so that a snapshot and a pause of one
tenant also wait for each other. In this plane only: planes sharing a store keep their own turns.

Order: a caller holding a session's lock (pausing.py) may take its tenant's turn; nothing holding a turn waits for a
session's lock. The turn is re-entrant along a task and the tasks it starts: a check under the turn may find the
session's sandbox gone, and the session's end (run in a task of its own) then keeps its workspace under the turn its
starter already holds, instead of waiting for it forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator

_HELD: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("tenant_turns_held", default=frozenset())
"""The tenants whose turn this task (or the task that started it) holds: copied into every task started under it."""


class TenantTurns:
    def __init__(self) -> None:
        self._turns: dict[str, _Turn] = {}

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        held = _HELD.get()
        if tenant in held:
            yield
            return
        # Dropped when no one holds or waits for it, so that a plane serving many tenants keeps no lock per tenant.
        turn = self._turns.setdefault(tenant, _Turn())
        turn.users += 1
        try:
            async with turn.lock:
                token = _HELD.set(held | {tenant})
                try:
                    yield
                finally:
                    _HELD.reset(token)
        finally:
            turn.users -= 1
            if not turn.users and self._turns.get(tenant) is turn:
                del self._turns[tenant]


class _Turn:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
