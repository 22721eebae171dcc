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

from controlplane.errors import ResourceExhaustedError

log = logging.getLogger(__name__)
SUBSCRIBER_BACKLOG = 4096


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
    def __init__(self, tenant: str, session_id: str) -> None:
        self.tenant = tenant
        self.session_id = session_id
        self.queue: asyncio.Queue[BusEvent | None] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self.overflowed = False

    def wants(self, event: BusEvent) -> bool:
        return event.tenant == self.tenant and (not self.session_id or event.session_id == self.session_id)

    def offer(self, event: BusEvent) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True
            self.queue.get_nowait()  # room for the end marker
            self.queue.put_nowait(None)


class EventBus:
    def __init__(self) -> None:
        self._subscriptions: set[_Subscription] = set()
        self._listeners: list[Listener] = []
        self._pending: set[asyncio.Task[None]] = set()

    def listen(self, listener: Listener) -> None:
        """`listener` is awaited (in the background) for every event: the `event` plugin hook."""
        self._listeners.append(listener)

    def publish(self, type_: str, tenant: str, session_id: str, **properties: Any) -> None:
        event = BusEvent(type_, tenant, session_id, properties)
        for subscription in list(self._subscriptions):
            if subscription.wants(event) and not subscription.overflowed:
                subscription.offer(event)
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
        subscription = _Subscription(tenant, session_id)
        self._subscriptions.add(subscription)
        try:
            while True:
                event = await subscription.queue.get()
                if event is None:
                    raise ResourceExhaustedError(
                        f"event subscription dropped: more than {SUBSCRIBER_BACKLOG} events were not read in time"
                    )
                yield event
        finally:
            self._subscriptions.discard(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)
