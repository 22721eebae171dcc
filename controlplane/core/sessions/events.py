"""The bus: every session, tool-state and permission event, fanned out to subscribers.

Publishing never blocks. A subscriber that falls too far behind loses its subscription (its stream
ends with an error) instead of slowing the control plane down or growing memory without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.core.sessions.held_bytes import approximate_size
from controlplane.errors import ResourceExhaustedError

log = logging.getLogger(__name__)
SUBSCRIBER_BACKLOG = 4096
SUBSCRIBER_BACKLOG_BYTES = 16 * 1024 * 1024
"""What a subscriber's unread events may come to (estimated, held_bytes): a count alone let three idle
subscriptions and forty 4 MiB todo lists hold over a GB."""


@dataclass(frozen=True)
class BusEvent:
    type: str
    """`session.created`, `tool.state`, `permission.asked`, `permission.replied`, ..."""
    tenant: str
    session_id: str
    properties: dict[str, Any]
    time: float = field(default_factory=time.time)


Listener = Callable[[BusEvent], Awaitable[None]]


class _Subscription:
    def __init__(self, tenant: str, session_id: str, max_bytes: int) -> None:
        self.tenant = tenant
        self.session_id = session_id
        self.queue: asyncio.Queue[BusEvent | None] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self.overflowed = False
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.sizes: dict[int, int] = {}
        """Estimated size of each queued event, by id(): taken off when the subscriber reads it."""

    def wants(self, event: BusEvent) -> bool:
        return event.tenant == self.tenant and (not self.session_id or event.session_id == self.session_id)

    def offer(self, event: BusEvent, size: int) -> None:
        if self.max_bytes and self.queued_bytes + size > self.max_bytes:
            self._overflow()
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self._overflow()
            return
        self.queued_bytes += size
        self.sizes[id(event)] = self.sizes.get(id(event), 0) + size

    def taken(self, event: BusEvent) -> None:
        self.queued_bytes -= self.sizes.pop(id(event), 0)

    def _overflow(self) -> None:
        self.overflowed = True
        while not self.queue.empty():  # the backlog goes at once, not when the subscriber next reads
            self.queue.get_nowait()
        self.sizes.clear()
        self.queued_bytes = 0
        self.queue.put_nowait(None)


class EventBus:
    def __init__(self, max_backlog_bytes: int = SUBSCRIBER_BACKLOG_BYTES) -> None:
        self.max_backlog_bytes = max_backlog_bytes
        self._subscriptions: set[_Subscription] = set()
        self._listeners: list[Listener] = []
        self._pending: set[asyncio.Task[None]] = set()

    def listen(self, listener: Listener) -> None:
        """`listener` is awaited (in the background) for every event: the `event` plugin hook."""
        self._listeners.append(listener)

    def publish(self, type_: str, tenant: str, session_id: str, **properties: Any) -> None:
        event = BusEvent(type_, tenant, session_id, properties)
        size = -1
        for subscription in list(self._subscriptions):
            if subscription.wants(event) and not subscription.overflowed:
                if size < 0:  # sized once, only when someone will hold it
                    size = approximate_size(properties)
                subscription.offer(event, size)
        for listener in self._listeners:
            task = asyncio.ensure_future(self._notify(listener, event))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    @staticmethod
    async def _notify(listener: Listener, event: BusEvent) -> None:
        try:
            await listener(event)
        except Exception:  # a broken listener must not touch the publisher
            log.exception("event listener failed on %s", event.type)

    async def subscribe(self, tenant: str, session_id: str = "") -> AsyncGenerator[BusEvent, None]:
        """Events of `tenant` (and of one session when given) from now on, until the caller stops."""
        subscription = _Subscription(tenant, session_id, self.max_backlog_bytes)
        self._subscriptions.add(subscription)
        try:
            while True:
                event = await subscription.queue.get()
                if event is None:
                    raise ResourceExhaustedError(
                        f"event subscription dropped: more than {SUBSCRIBER_BACKLOG} events or "
                        f"{self.max_backlog_bytes} bytes of events were not read in time"
                    )
                subscription.taken(event)
                yield event
        finally:
            self._subscriptions.discard(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)
