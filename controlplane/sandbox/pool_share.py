"""Each tenant's fair share of a warm pool every tenant takes from.

Measured (a Docker plane on this loaded 2-CPU machine, pool of 4, tenant A creating and deleting in three
loops, tenant B creating every 2 s; tests/bench/pool_share_bench.py): without a share B's create took 17 ms
alone and 6.4 s at the median during A's burst (7 of 10 cold: A took every pooled sandbox as soon as it was
ready); with it, 128 and 144 ms at the median in two runs (3 and 4 of 10 cold, the first two before B had
taken any). The rule: a tenant may take a pooled sandbox while the pool keeps the other recent takers' share
of it ready (half of it with one other, two thirds with two), or while it has taken no more than its share
of the recent takes (then even the last one is its due). A tenant alone on the pool, the common case, is
never held back: with no other tenant among the recent takes, every take is allowed, at the cost of one pass
over them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

RECENT_S = 60.0
"""How long a take counts: a tenant that has not created for a minute no longer holds a sandbox back."""
MAX_RECENT = 1024
"""A bound on what is remembered whatever the rate of takes (memory, and the cost of a count)."""


class PoolShare:
    def __init__(self, recent_s: float = RECENT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._recent_s = recent_s
        self._clock = clock
        self._takes: deque[tuple[float, str]] = deque(maxlen=MAX_RECENT)

    def _forget_old(self) -> None:
        horizon = self._clock() - self._recent_s
        while self._takes and self._takes[0][0] < horizon:
            self._takes.popleft()

    def may_take(self, tenant: str, ready: int, size: int) -> bool:
        """Whether `tenant` may take one of the `ready` sandboxes of a pool of `size` now (else its create is
        a cold one)."""
        self._forget_old()
        others = {t for _, t in self._takes if t != tenant}
        if not others or ready > max(len(others), size * len(others) // (len(others) + 1)):
            return True
        mine = sum(1 for _, t in self._takes if t == tenant)
        return mine * (len(others) + 1) <= len(self._takes)

    def took(self, tenant: str) -> None:
        self._takes.append((self._clock(), tenant))
