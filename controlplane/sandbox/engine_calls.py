"""Engine calls made in a thread, and the removal that must wait for them.

Cancelling the await of `asyncio.to_thread` does not stop the call in its thread. A sandbox whose creation
is cancelled (a shutdown cancels a pool refill) must not be removed while the engine is still creating it:
the removal would find nothing, and the creation would then leave a container or service behind, and a
workspace volume that the engine makes for a mount without the labels reconciliation looks for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def in_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` in a thread, as a future of its own: await it through `asyncio.shield`, so that a cancelled
    caller can still wait for it with `after`."""
    return asyncio.ensure_future(asyncio.to_thread(fn, *args))


async def after(call: asyncio.Future[Any] | None, cleanup: Awaitable[None]) -> None:
    """Awaits `cleanup` once `call` (None: no call was started) is over, whatever its outcome."""
    if call is not None:
        try:
            await call
        except asyncio.CancelledError:
            if not call.cancelled():
                raise
        except Exception:  # its failure is what the caller is raising
            pass
    await cleanup


class Cleanups:
    """Removals that outlive the caller that started them (it was cancelled): the provider waits for them
    before it closes its engine client, so a shutdown does not cut one off halfway."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[None]] = set()

    def start(self, cleanup: Awaitable[None]) -> asyncio.Future[None]:
        """Runs `cleanup` as a task of its own; await the result through `asyncio.shield`."""
        task = asyncio.ensure_future(cleanup)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def wait(self) -> None:
        if self._running:
            await asyncio.wait(list(self._running))
