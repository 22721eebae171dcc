"""A warm pool of ready sandboxes, refilled in the background after every claim."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from controlplane.core.seam.provider import PoolStats, Sandbox
from controlplane.sandbox.pool_share import PoolShare
from controlplane.telemetry import spans

log = logging.getLogger(__name__)


class WarmPool:
    """Keeps `size` sandboxes ready; `take()` never waits for a creation."""

    def __init__(
        self,
        size: int,
        concurrency: int,
        create: Callable[[], Awaitable[Sandbox]],
        discard: Callable[[str], Awaitable[None]],
        check: Callable[[Sandbox], Awaitable[bool]],
    ) -> None:
        self._size = size
        self._semaphore = asyncio.Semaphore(concurrency)
        self._create = create
        self._discard = discard
        self._check = check
        self._ready: deque[Sandbox] = deque()
        self._creating = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._failures = 0
        self.hits = 0
        self.misses = 0
        self.share = PoolShare()
        spans.pool_depth.watch(self, lambda pool: len(pool._ready))

    def adopt(self, sandbox: Sandbox) -> None:
        self._ready.append(sandbox)

    def ids(self) -> set[str]:
        return {s.id for s in self._ready}

    def start(self) -> None:
        self._kick()

    def _kick(self) -> None:
        if not self._closed and self._size > 0 and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._refill())

    async def _refill(self) -> None:
        while not self._closed and len(self._ready) + self._creating < self._size:
            missing = self._size - len(self._ready) - self._creating
            self._creating += missing
            results = await asyncio.gather(*(self._create_one() for _ in range(missing)), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                self._failures += 1
                log.warning("warm pool refill failed (%d in a row): %s", self._failures, errors[0])
                await asyncio.sleep(min(30.0, 0.5 * 2 ** min(self._failures, 6)))
            else:
                self._failures = 0

    async def _create_one(self) -> None:
        try:
            async with self._semaphore:
                sandbox = await self._create()
        finally:
            self._creating -= 1
        if self._closed:
            await self._discard(sandbox.id)
        else:
            self._ready.append(sandbox)

    async def take(self, tenant: str = "") -> Sandbox | None:
        """A checked, ready sandbox, or None when the pool is empty or `tenant` has had its share of it now
        (pool_share.py: the pool is shared by every tenant; "" takes without a share)."""
        if tenant and not self.share.may_take(tenant, len(self._ready), self._size):
            self.misses += 1
            spans.pool_misses.add(1)
            return None
        while self._ready:
            sandbox = self._ready.popleft()
            self._kick()
            try:
                healthy = await self._check(sandbox)
            except BaseException:  # taken out of the pool and not handed over: nobody else would remove it
                await asyncio.shield(self._discard(sandbox.id))
                raise
            if healthy:
                if tenant:
                    self.share.took(tenant)
                self.hits += 1
                spans.pool_hits.add(1)
                return sandbox
            log.warning("pooled sandbox %s failed its check; discarding it", sandbox.id)
            await self._discard(sandbox.id)
        self.misses += 1
        spans.pool_misses.add(1)
        self._kick()
        return None

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._ready:
            await self._discard(self._ready.popleft().id)

    def stats(self) -> PoolStats:
        return PoolStats(len(self._ready), self._creating, self._size, self.hits, self.misses)
