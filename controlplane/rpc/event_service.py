"""controlplane.v1.EventService: the bus of the caller's tenant as a server stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from controlplane.core.sessions.events import BusEvent, EventBus
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.recent_logs import RecentLogs
from controlplane.core.tenants.quota import Slot, TenantQuotas
from controlplane.errors import ControlPlaneError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import abort_with
from controlplane.v1 import event_pb2, event_pb2_grpc


class EventService(event_pb2_grpc.EventServiceServicer):
    def __init__(
        self, sessions: SessionManager, bus: EventBus, auth: Authenticator, quotas: TenantQuotas | None = None,
        recent_logs: RecentLogs | None = None,
    ) -> None:
        self._sessions = sessions
        self._bus = bus
        self._recent_logs = recent_logs
        self._auth = auth
        self._quotas = quotas or TenantQuotas.unlimited()

    async def SubscribeEvents(
        self, request: event_pb2.SubscribeEventsRequest, context: Any
    ) -> AsyncIterator[event_pb2.Event]:
        slot: Slot | None = None
        try:
            tenant = self._auth.tenant_of(context)
            slot = self._quotas.take_subscription(tenant.name)
            if request.session_id:
                await self._sessions.get(tenant.name, request.session_id)  # NotFound for others' sessions
            # Headers go out now, so a subscriber knows it is subscribed before the first event.
            await context.send_initial_metadata(())
            live: AsyncIterator[BusEvent] = self._bus.subscribe(tenant.name, request.session_id)
            replayed: set[int] = set()
            if request.recent_logs and self._recent_logs is not None:
                # Subscribed first, then the held lines: none is missed in between; one both hold is sent once.
                first = asyncio.ensure_future(anext(live))
                await asyncio.sleep(0)
                for event in self._recent_logs.recent(tenant.name, request.session_id):
                    replayed.add(id(event))
                    yield _message(event)
                live = _after(first, live)
            async for event in live:
                self._auth.tenant_of(context)  # a token revoked (or expired) meanwhile ends the stream here
                if id(event) not in replayed:
                    yield _message(event)
        except ControlPlaneError as exc:
            await abort_with(context, exc)
        finally:
            if slot is not None:
                slot.release()


def _message(event: BusEvent) -> event_pb2.Event:
    return event_pb2.Event(
        type=event.type, session_id=event.session_id, time=event.time,
        properties_json=json.dumps(event.properties, ensure_ascii=False, default=str),
    )


async def _after(first: asyncio.Future[BusEvent], rest: AsyncIterator[BusEvent]) -> AsyncIterator[BusEvent]:
    try:
        yield await first
        async for event in rest:
            yield event
    finally:
        first.cancel()
