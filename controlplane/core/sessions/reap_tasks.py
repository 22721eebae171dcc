"""The reaper's work on single sessions (an idle pause, an expiry with its kept copy), each a task of its own.

A pause or a kept copy reads the workspace from the session's agent, and a compromised agent can leave that read
unanswered until the copy is given up (`workspace_spool.PIECE_WAIT_S`). Awaited one after another in the reaper's
round, one such session held up every other tenant's pauses and expiries for that long each. As tasks, a stalled
session holds only its own slot: the round goes on, and so do the next ones.

The slots are bounded, in all and per tenant, so that a tenant whose sessions all stall cannot take every slot
from the others (its own sessions wait for a later round; its copies also take its turn one at a time,
tenant_turns.py, so two stalled sessions of one tenant hold one of the plane's copy turns, not both: measured, another
tenant's idle pause then came 1.4 s after it was due, as with one). A session whose handling is in flight is skipped
by the next rounds, so that no session is paused or ended twice at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)
AT_ONCE = 256
"""Sessions handled at once by one plane's reaper: a bound on its tasks, not on its copies (the copy turns bound
those, workspace_spool.py). A task waiting for a copy turn costs a coroutine; at 16, four tenants whose agents
never answered a copy held every slot, and another tenant's sessions were neither paused nor expired, even
those whose end needs no copy (red team, 2026-11-28)."""
PER_TENANT = 4
"""Of those, the most one tenant's sessions take."""


class ReapTasks:
    def __init__(self, at_once: int = AT_ONCE, per_tenant: int = PER_TENANT) -> None:
        self._at_once = at_once
        self._per_tenant = per_tenant
        self._running: dict[str, tuple[str, asyncio.Task[Any]]] = {}
        """Session id: its tenant and the task handling it."""
        self._closed = False

    def busy(self, session_id: str) -> bool:
        return session_id in self._running

    def start(self, tenant: str, session_id: str, work: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any] | None:
        """Runs `work()` as the session's task; None (and `work` is not called) when the session is handled
        already, when every slot is taken, or when the tenant's are: a later round tries again."""
        if self._closed or session_id in self._running or len(self._running) >= self._at_once:
            return None
        if sum(1 for owner, _ in self._running.values() if owner == tenant) >= self._per_tenant:
            return None
        task = asyncio.ensure_future(work())
        self._running[session_id] = (tenant, task)
        task.add_done_callback(lambda done: self._forget(session_id, done))
        return task

    async def close(self) -> None:
        """Cancels what is in flight and waits for it: a pause cancelled midway leaves the session READY and its
        partial copy removed (pausing.py), an expiry's ending is shielded and finishes (manager.py `_end`)."""
        self._closed = True
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        if tasks:  # their failures are logged by `_forget`
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, session_id: str, done: asyncio.Task[Any]) -> None:
        held = self._running.get(session_id)
        if held is not None and held[1] is done:
            del self._running[session_id]
        # Any failure (the engine's, the store's): the session is left as it was, and a later round tries again.
        if not done.cancelled() and (exc := done.exception()) is not None:
            log.error("the reaper's work on session %s failed; tried again next round", session_id, exc_info=exc)


async def succeeded(started: dict[str, asyncio.Task[Any]]) -> list[str]:
    """Once the tasks `started` (by session id) are over, the sessions whose task returned True."""
    results = await asyncio.gather(*started.values(), return_exceptions=True)
    return [session_id for session_id, result in zip(started, results, strict=True) if result is True]


async def rounds(interval_s: float, work: Callable[[], list[Callable[[], Awaitable[Any]]]]) -> None:
    """The reaper: every `interval_s`, each of `work()` in turn (each starts its sessions' tasks, never awaits
    them)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            for part in work():
                await part()
        except Exception:  # any failure: lifetimes must keep being enforced, next round tries again
            log.exception("reaping expired sessions failed")
