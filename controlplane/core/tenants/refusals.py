"""When a tenant's refused requests are answered: a budget of refusals a second, not the client's retry rate.

A refusal costs the control plane far more than it costs the client that caused it (authentication, the
handler, the audit record, a span, the status on the wire), and a client retrying at once is answered at once:
a tenant with a `calls` quota of 2 and 50 ExecuteTool streams retrying in a loop drove 700 to 1,000 refusals a
second, half a core every tenant shares, and lowering its quota made it worse (more of its calls refused).

So each tenant's refusals are released on a schedule: each is held at least `pause_s` (so a single retry loop
makes at most a few a second), and all of a tenant's refusals together leave at most `rate` a second after a
burst of `burst` (a GCRA schedule: no timer per tenant, one sleep per held refusal). A client with more
streams open than that waits longer for each refusal; it does not get more of them. Holding is cheap for a
stream refused before its first message (ExecuteTool, Exec: a coroutine and the stream's state), but a refused
CreateSession holds its request (its archive may be many MiB), so what one tenant may keep held is bounded by
count (`max_held`) and by request bytes (`max_held_bytes`). Past either, a refusal is answered at once: the
only path where the client's retries set the rate, and it takes more than `max_held` streams open at once.

Not a per-connection stream limit (HTTP/2's MAX_CONCURRENT_STREAMS, `grpc.max_concurrent_streams`): measured
at 100 with gRPC's Python client, 200 streams on one channel were refused by the transport (RST_STREAM
REFUSED_STREAM, which the client does not retry), a tight loop of failures, and another tenant's call in the
same process took 4 s instead of 16 ms.

Per tenant: one tenant's schedule never delays another's refusals, and nothing here touches admitted work.
The same gate, keyed by the client's address instead, paces refused tokens (controlplane.rpc.auth): a token no
tenant holds costs a client nothing to send, so its refusals are held like a tenant's, and past the bounds
answered at once (what a client with more than MAX_HELD streams open then spends, it spends per refusal).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

REFUSAL_PAUSE_S = 0.1
"""The least a refusal is held. A client retrying at once in a loop (a bug or a flood) made 1,000 to 2,000
refused creates a second (the fairness bench); held, each of its loops makes ten."""
REFUSALS_PER_S = 20.0
"""A tenant's refusals answered a second, once its burst is spent, however many requests it has refused."""
BURST = 8
"""Refusals of one tenant answered together after the pause (a client's few concurrent ones are not spaced)."""
MAX_HELD = 256
"""Refusals of one tenant held at once (each waiting for its turn on the schedule)."""
MAX_HELD_BYTES = 64 * 1024 * 1024
"""Request bytes those held refusals keep (a CreateSession's archive, and gRPC's copy of it off the wire)."""
HELD_STREAM_BYTES = 256 * 1024
"""What one held refusal of a request stream counts against MAX_HELD_BYTES, read or not: its messages are never
read, but gRPC takes what the client sends up to the stream's receive window into its own buffers. Counted as
nothing, 200 held Exec streams each sending 8 MiB at once grew the plane by 2.4 GiB, because gRPC's BDP probing
grew each stream's window to the whole message; the plane's server turns that probing off (controlplane.rpc.
server.RECEIVE_WINDOW_OPTIONS), which leaves each stream HTTP/2's 64 KiB window: measured at 120 KiB a held
stream with its state and frames, so 256 KiB is a worst case with room, and MAX_HELD of them fit the byte bound."""
MAX_TOKEN_REFUSAL_BYTES = 2 * MAX_HELD_BYTES
"""Refused tokens' held bytes from every client address together: two addresses' worth (a client with many
addresses held 64 MiB on each: 8 loopback addresses, +209 MiB). Past it, a refusal is answered at once."""


@dataclass
class _Schedule:
    tat: float = 0.0
    """When the tenant's next refusal may leave once the burst is spent (GCRA's theoretical arrival time)."""
    held: int = 0
    held_bytes: int = 0
    answered_at_once: int = 0


class RefusalGate:
    """Holds refusals per tenant until their turn; `hold` returns when the refusal may be sent."""

    def __init__(self, *, pause_s: float = REFUSAL_PAUSE_S, rate: float = REFUSALS_PER_S, burst: int = BURST,
                 max_held: int = MAX_HELD, max_held_bytes: int = MAX_HELD_BYTES, forget_idle: bool = False,
                 max_total_bytes: int | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"refusals need a rate > 0 and a burst >= 1, got {rate} and {burst}")
        self._pause_s = pause_s
        self._interval = 1.0 / rate
        self._tolerance = (burst - 1) * self._interval
        self._max_held = max_held
        self._max_held_bytes = max_held_bytes
        self._tenants: dict[str, _Schedule] = {}
        self._max_total_bytes = max_total_bytes
        """All keys' held bytes together, where keys are not a closed set (client addresses: a client with many
        of them, an IPv6 range or many hosts, held 64 MiB on each)."""
        self._total_bytes = 0
        self._forget_idle = forget_idle
        """Keys no one chooses the number of (client addresses): a schedule nothing is held on, and whose next
        refusal would be scheduled as a new one's, is dropped, so that the schedules kept stay as many as held."""

    def held(self, tenant: str) -> tuple[int, int]:
        """How many of the tenant's refusals are held, and the request bytes they keep."""
        schedule = self._tenants.get(tenant, _Schedule())
        return schedule.held, schedule.held_bytes

    def answered_at_once(self, tenant: str) -> int:
        """Refusals past the holding bounds (each one a sign of a client with many connections)."""
        return self._tenants.get(tenant, _Schedule()).answered_at_once

    def total_bytes(self) -> int:
        """The request bytes every key's held refusals keep together."""
        return self._total_bytes

    def kept(self) -> int:
        """How many schedules the gate keeps (tenants', or client addresses')."""
        return len(self._tenants)

    def forget(self, tenant: str) -> None:
        schedule = self._tenants.get(tenant)
        if schedule is not None and not schedule.held:
            del self._tenants[tenant]

    async def hold(self, tenant: str, request_bytes: int = 0) -> None:
        if self._pause_s <= 0:
            return
        schedule = self._tenants.get(tenant)
        if schedule is None:
            if self._forget_idle:
                self._drop_oldest_idle()
            schedule = self._tenants[tenant] = _Schedule()
        if schedule.held >= self._max_held or (
            request_bytes and schedule.held_bytes + request_bytes > self._max_held_bytes
        ) or (self._max_total_bytes is not None and self._total_bytes + request_bytes > self._max_total_bytes):
            schedule.answered_at_once += 1
            self._drop_if_idle(tenant, schedule)
            return
        now = asyncio.get_running_loop().time()
        earliest = now + self._pause_s
        # The slot this refusal takes: within the burst it leaves after its pause; past it, one interval after
        # the tenant's previous one. A cancelled waiter's slot is not given back (the schedule stays strict).
        slot = max(schedule.tat, earliest - self._tolerance)
        schedule.tat = slot + self._interval
        schedule.held += 1
        schedule.held_bytes += request_bytes
        self._total_bytes += request_bytes
        try:
            await asyncio.sleep(max(earliest, slot) - now)
        finally:
            schedule.held -= 1
            schedule.held_bytes -= request_bytes
            self._total_bytes -= request_bytes
            self._drop_if_idle(tenant, schedule)

    def _idle(self, schedule: _Schedule) -> bool:
        return not schedule.held and schedule.tat <= asyncio.get_running_loop().time() + self._pause_s - self._tolerance

    def _drop_if_idle(self, key: str, schedule: _Schedule) -> None:
        if self._forget_idle and self._idle(schedule) and self._tenants.get(key) is schedule:
            del self._tenants[key]

    def _drop_oldest_idle(self) -> None:
        """Looks at the two oldest schedules for each new one (a busy one goes to the back): those left idle by a
        key that made its last refusals in a burst go too, so the schedules kept never outgrow twice the busy."""
        for key in list(itertools.islice(self._tenants, 2)):
            schedule = self._tenants.pop(key)
            if not self._idle(schedule):
                self._tenants[key] = schedule
