"""The latest `tool.log` events of each session, for a subscriber that asks for them first
(`SubscribeEvents.recent_logs`, `controlplane logs SESSION`).

Bounded per session in bytes (the oldest go first, and the replay starts with a line saying how many went),
and forgotten when the session ends: a tool printing in a loop cannot grow the control plane.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from controlplane.core.sessions.events import BusEvent, EventBus

SESSION_LOG_BYTES = 256 * 1024
LOG_EVENT = "tool.log"
ENDED = frozenset({"session.deleted", "session.failed"})


def _size(event: BusEvent) -> int:
    return sum(len(str(v)) for v in event.properties.values()) + 64


@dataclass
class _Ring:
    events: collections.deque[BusEvent] = field(default_factory=collections.deque)
    bytes: int = 0
    dropped: int = 0


class RecentLogs:
    def __init__(self, bus: EventBus, max_bytes: int = SESSION_LOG_BYTES) -> None:
        self._max_bytes = max_bytes
        self._rings: dict[tuple[str, str], _Ring] = {}
        bus.listen(self._on_event)

    async def _on_event(self, event: BusEvent) -> None:
        self.add(event)

    def add(self, event: BusEvent) -> None:
        key = (event.tenant, event.session_id)
        if event.type in ENDED:
            self._rings.pop(key, None)
            return
        if event.type != LOG_EVENT:
            return
        ring = self._rings.setdefault(key, _Ring())
        ring.events.append(event)
        ring.bytes += _size(event)
        while ring.bytes > self._max_bytes and ring.events:
            ring.bytes -= _size(ring.events.popleft())
            ring.dropped += 1

    def recent(self, tenant: str, session_id: str = "") -> list[BusEvent]:
        """The held events of one session of `tenant` (of all its sessions when `session_id` is empty), oldest
        first; a session that lost some starts with a `tool.log` line saying how many."""
        found: list[BusEvent] = []
        for (owner, session), ring in list(self._rings.items()):
            if owner != tenant or (session_id and session != session_id):
                continue
            if ring.dropped:
                first = ring.events[0].time if ring.events else 0.0
                found.append(BusEvent(LOG_EVENT, owner, session, {
                    "callID": "", "origin": "", "level": "warn", "time": first,
                    "text": f"[{ring.dropped} older log lines dropped]",
                }, time=first))
            found += ring.events
        return sorted(found, key=lambda e: e.time) if not session_id else found

    def sessions(self) -> int:
        return len(self._rings)
