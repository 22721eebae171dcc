"""Tasks that may outlive the caller that started them, kept so that a shutdown can wait for them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class TrackedTasks:
    """A set of running tasks: each leaves it when done; `wait` returns once none is left running."""

    def __init__(self) -> None:
        self._running: set[asyncio.Future[Any]] = set()

    def __bool__(self) -> bool:
        return bool(self._running)

    def start(self, work: Awaitable[T]) -> asyncio.Future[T]:
        """Runs `work` as a task of its own, kept until it ends."""
        task = asyncio.ensure_future(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def run(self, work: Awaitable[T]) -> T:
        """Starts `work` and awaits it; a caller that is cancelled meanwhile leaves it running to its end."""
        return await asyncio.shield(self.start(work))

    async def wait(self) -> None:
        if self._running:
            await asyncio.wait(list(self._running))
