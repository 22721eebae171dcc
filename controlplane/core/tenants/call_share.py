"""A fair share of the plane's concurrent calls among the tenants using it (issue 22, the calls phase).

The `calls` quota bounds how many calls one tenant holds; it says nothing of who else is calling. A tenant
keeping its eight admitted calls busy made another tenant's short `bash` call four to five times slower (11-12 ms
alone, 41-60 ms beside them in the fairness bench): the plane spends most of its CPU on gRPC's native work for
every call in flight, so what the other tenant's call waits for grows with how many of the busy tenant's calls run
beside it. A turn at call start reordered little of that work; what helps, as for creates (fair_gate.py), is fewer
of the busy tenant's calls beside the other's.

So a call, once inside its tenant's quota, waits here for a turn before the plane reads it:

* a tenant alone keeps its whole quota (nothing changes for it);
* while other tenants are active, each tenant may run `width // active` calls at once (never fewer than one), and
  its other admitted calls wait their turn, first in first out per tenant and round robin across tenants, instead
  of being refused;
* a tenant counts as active while it has a call waiting or one that started less than LONG_S ago, and for RECENT_S
  after one of its calls ended: a
  client whose calls are sequential and short has none in flight most of the time, and its next call would
  otherwise find the busy tenant at full width again;
* a call running for LONG_S no longer counts against its tenant's share (it still counts in its quota): a flood's
  calls are short and many, while one long command (a build, a server) would otherwise hold a tenant to nothing
  else for as long as another tenant calls.

A waiting call that is cancelled (its client gone, its deadline passed) leaves the queue at once. A call waiting
here already holds its quota slot, so a flood beyond the quota is refused as before, and what waits is bounded by
the quotas. This module knows no transport; the gRPC layer asks for a turn before it accepts a request stream.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable

RECENT_S = 1.5
"""How long a tenant stays active after its last call ended: longer than the gaps between a client's sequential
calls (and a create between them, about a second on a busy host)."""


LONG_S = 2.0
"""A call running this long stops counting against its tenant's share."""


def default_width() -> int:
    """The plane's concurrent calls shared among active tenants: one a CPU (at least two), which is about what
    the plane keeps busy; a lone tenant is not bound by it."""
    return max(2, os.cpu_count() or 1)


class CallShare:
    def __init__(self, width: int | None = None, recent_s: float = RECENT_S, long_s: float = LONG_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        width = default_width() if width is None else width
        if width < 1:
            raise ValueError(f"the calls shared among tenants must be at least 1, not {width}")
        self._width = width
        self._recent_s = recent_s
        self._long_s = long_s
        self._clock = clock
        self._running: dict[str, dict[object, float]] = {}
        """Per tenant, its running calls' start times."""
        self._ended_at: dict[str, float] = {}
        """When a tenant's last call ended (dropped once older than recent_s)."""
        self._waiting: OrderedDict[str, deque[tuple[asyncio.Future[object], int | None]]] = OrderedDict()
        """Per tenant, its waiting calls with the tenant's quota when each asked, in the order tenants are served
        next; a tenant moves to the end when one of its calls is let in."""
        self._wake: asyncio.TimerHandle | None = None
        self._wake_due = 0.0

    @property
    def width(self) -> int:
        return self._width

    def running(self, tenant: str) -> int:
        return len(self._running.get(tenant, ()))

    def counted(self, tenant: str) -> int:
        """The tenant's running calls that count against its share: those started less than long_s ago."""
        now = self._clock()
        return sum(1 for at in self._running.get(tenant, {}).values() if now - at < self._long_s)

    def waiting(self, tenant: str | None = None) -> int:
        if tenant is not None:
            return len(self._waiting.get(tenant, ()))
        return sum(len(q) for q in self._waiting.values())

    def active(self) -> set[str]:
        """Tenants with a call waiting or started less than long_s ago, or one that ended less than recent_s ago
        (a tenant whose only calls are long ones, a server say, is not calling much)."""
        now = self._clock()
        for tenant in [t for t, at in self._ended_at.items() if now - at >= self._recent_s]:
            del self._ended_at[tenant]
        return {t for t in self._running if self.counted(t)} | set(self._waiting) | set(self._ended_at)

    def share(self, tenant: str, limit: int | None) -> int | None:
        """How many calls `tenant` may run at once now (None: unbounded here): its quota `limit` while no other
        tenant is active, else the width divided among the active tenants, this one included."""
        active = self.active() | {tenant}
        if len(active) == 1:
            return limit
        even = max(1, self._width // len(active))
        return even if limit is None else min(limit, even)

    async def turn(self, tenant: str, limit: int | None) -> Callable[[], None]:
        """Waits until `tenant` may run one more call (`limit`: its calls quota, None for none); returns what
        ends the call's turn, to be called once."""
        if tenant not in self._waiting and self._fits(tenant, limit):
            call = self._start(tenant)
        else:
            turn: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append((turn, limit))
            self._wake_at_decay()
            try:
                call = await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._end(tenant, turn.result())  # let in and cancelled at once: the turn goes to the next call
                else:
                    self._forget(tenant, turn)
                raise
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self._end(tenant, call)

        return end

    def _fits(self, tenant: str, limit: int | None) -> bool:
        share = self.share(tenant, limit)
        return share is None or self.counted(tenant) < share

    def _start(self, tenant: str) -> object:
        call = object()
        self._running.setdefault(tenant, {})[call] = self._clock()
        return call

    def _end(self, tenant: str, call: object) -> None:
        running = self._running.get(tenant, {})
        running.pop(call, None)
        if not running:
            self._running.pop(tenant, None)
        self._ended_at[tenant] = self._clock()
        self._fill()

    def _forget(self, tenant: str, turn: asyncio.Future[object]) -> None:
        queue = self._waiting.get(tenant)
        if queue is not None:
            for entry in queue:
                if entry[0] is turn:
                    queue.remove(entry)
                    break
            if not queue:
                del self._waiting[tenant]
                self._ended_at[tenant] = self._clock()  # it asked just now: still active a while
        self._fill()  # the call gone may have been the one in front of others that fit now

    def _fill(self) -> None:
        """Lets in the first waiting call of each tenant in turn that is under its share, and, while calls are
        left waiting, wakes up again when the next tenant stops counting as active (shares grow then)."""
        while True:
            tenant = next((t for t in self._waiting if self._fits(t, self._waiting[t][0][1])), None)
            if tenant is None:
                break
            queue = self._waiting[tenant]
            turn, _ = queue.popleft()
            if queue:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            if not turn.done():
                turn.set_result(self._start(tenant))
        self._wake_at_decay()

    def _wake_at_decay(self) -> None:
        """While calls wait, a timer for the next moment a share may grow though no call ends: an active tenant's
        window ending, or a running call turning long (one timer, moved only when an earlier
        moment is due)."""
        if not self._waiting:
            return
        moments = [at + self._recent_s for at in self._ended_at.values()]
        now = self._clock()
        for running in self._running.values():
            moments += [at + self._long_s for at in running.values() if now - at < self._long_s]
        if not moments:
            return
        due = min(moments)
        if self._wake is not None and self._wake_due <= due:
            return
        if self._wake is not None:
            self._wake.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: nothing can be waiting then
            return
        self._wake_due = due
        self._wake = loop.call_later(max(0.0, due - now) + 0.001, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self._fill()
