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

