"""What the session proxies did, for the operator: an audit row and a span per connection, OTel counters by
tenant, and byte totals per session and per tenant (AdminService.GetUsage).

A tenant's total survives its sessions and restarts: each session's bytes are added to its row in the store
(so a session adopted by a restarted control plane goes on from its stored figure), and a tenant's figure is
the sum of its sessions' rows. Writes are batched (at most one per session every FLUSH_S), and GetUsage
flushes first, so what it reports includes the last transfer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode

from controlplane.core.permissions.audit import AuditEntry, AuditLog, CoalescedRefusals
from controlplane.egress_proxy.types import ConnectionRecord
from controlplane.telemetry import attributes as a

log = logging.getLogger(__name__)

FLUSH_S = 1.0
REFUSAL_WINDOW_S = 1.0
SPAN_CONNECT: Final = "egress.connect"
HOST: Final = "sandbox.egress.host"
PORT: Final = "sandbox.egress.port"
ADDRESS: Final = "sandbox.egress.address"
DECISION: Final = "sandbox.egress.decision"
DIRECTION: Final = "sandbox.egress.direction"
BYTES_UP: Final = "sandbox.egress.bytes.up"
BYTES_DOWN: Final = "sandbox.egress.bytes.down"
INTERCEPTED: Final = "sandbox.egress.intercepted"

tracer = trace.get_tracer(a.TRACER_NAME)
meter = metrics.get_meter(a.METER_NAME)
bytes_counter = meter.create_counter(
    "ocsandbox.egress.bytes", unit="By", description="Bytes through the session proxies, by tenant and direction")
connections_counter = meter.create_counter(
    "ocsandbox.egress.connections", description="Connections the session proxies answered, by tenant and decision")


class EgressStore(Protocol):
    async def add_session_egress(self, session_id: str, tenant: str, added_bytes: int) -> None:
        """Adds bytes to the session's stored total (made at the first call)."""
        ...

    async def session_egress_bytes(self, session_id: str) -> int: ...

    async def tenant_egress_bytes(self, tenant: str) -> int: ...


@dataclass
class _Totals:
    tenant: str
    up: int = 0
    down: int = 0
    connections: int = 0
    refused: int = 0
    unwritten: int = 0
    """Bytes not yet added to the store."""

    @property
    def total(self) -> int:
        return self.up + self.down


def refusal_rule(reason: str) -> str:
    """The audit `rule` of a refusal: a few fixed categories, so that a sandbox varying the host it asks for
    still makes at most one row per category and window (CoalescedRefusals) and cannot flood the audit."""
    if "not in this session's network policy" in reason:
        return "session network policy"
    if "operator's egress policy" in reason:
        return "operator egress policy"
    if "connections open" in reason:
        return "connection limit"
    return "unreachable"


class EgressAccounting:
    """Receives every ConnectionRecord of every session proxy (`record` is each proxy's `on_record`)."""

    def __init__(self, audit: AuditLog, store: EgressStore | None = None) -> None:
        self._audit = audit
        self._refusals = CoalescedRefusals(audit, REFUSAL_WINDOW_S)
        self._store = store
        self._sessions: dict[str, _Totals] = {}
        self._dirty: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._windows_end = 0.0
        """When the last refusal's coalescing window closes (its summary row is written then)."""

    def record(self, record: ConnectionRecord) -> None:
        totals = self._sessions.setdefault(record.session_id, _Totals(record.tenant))
        totals.up += record.bytes_up
        totals.down += record.bytes_down
        totals.connections += 1
        totals.refused += record.decision != "allowed"
        tenant = {a.TENANT: record.tenant}
        connections_counter.add(1, {**tenant, DECISION: record.decision})
        if record.bytes_up:
            bytes_counter.add(record.bytes_up, {**tenant, DIRECTION: "up"})
        if record.bytes_down:
            bytes_counter.add(record.bytes_down, {**tenant, DIRECTION: "down"})
        if record.decision != "allowed":
            self._windows_end = time.monotonic() + REFUSAL_WINDOW_S
        self._spawn(self._write_audit(record))
        if record.bytes_up or record.bytes_down:
            totals.unwritten += record.bytes_up + record.bytes_down
            self._dirty.add(record.session_id)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.ensure_future(self._flush_soon())

    def session_bytes(self, session_id: str) -> int:
        totals = self._sessions.get(session_id)
        return totals.total if totals is not None else 0

    def session_totals(self, session_id: str) -> tuple[int, int, int]:
        """(bytes up, bytes down, connections) of the session through this control plane."""
        t = self._sessions.get(session_id)
        return (t.up, t.down, t.connections) if t is not None else (0, 0, 0)

    async def tenant_bytes(self, tenant: str) -> int:
        """Bytes of every session of the tenant, ended ones and other runs of the control plane included
        (only this run's, without a store)."""
        if self._store is None:
            return sum(t.total for t in self._sessions.values() if t.tenant == tenant)
        await self.flush()
        return await self._store.tenant_egress_bytes(tenant)

    async def stored_session_bytes(self, session_id: str) -> int:
        """The session's bytes over every run of the control plane: what a session proxy started again for an
        adopted session seeds its ByteMeter with, so that a restart does not renew the session's budget."""
        if self._store is None:
            return self.session_bytes(session_id)
        await self.flush()
        return await self._store.session_egress_bytes(session_id)

    async def forget(self, session_id: str) -> None:
        """The session ended: its total is written and dropped from memory."""
        await self.flush()
        self._sessions.pop(session_id, None)

    async def flush(self) -> None:
        if self._store is None:
            self._dirty.clear()
            return
        while self._dirty:
            session_id = self._dirty.pop()
            totals = self._sessions.get(session_id)
            if totals is None or not totals.unwritten:
                continue
            amount = totals.unwritten
            try:
                await self._store.add_session_egress(session_id, totals.tenant, amount)
            except Exception as exc:  # accounting must not break the proxy; the next flush adds the bytes
                self._dirty.add(session_id)
                log.warning("could not store the network usage of session %s: %s", session_id, exc)
                return
            # Records that arrived while the write was under way stay unwritten.
            totals.unwritten -= amount

    async def close(self) -> None:
        pending = self._windows_end - time.monotonic()
        if pending > 0:
            # The refusals left out of the audit are counted in one row when their window closes: wait for it,
            # so the row is written before the store closes.
            await asyncio.sleep(pending + 0.05)
            await asyncio.sleep(0)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self.flush()

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_S)
        await self.flush()

    async def _write_audit(self, record: ConnectionRecord) -> None:
        refused = record.decision != "allowed"
        detail = (f"address {record.address or '-'}; {record.bytes_up} bytes up, {record.bytes_down} bytes down"
                  + ("; TLS opened to add a brokered credential" if record.intercepted else "")
                  + (f"; {record.reason}" if record.reason else ""))
        entry = AuditEntry(
            tenant=record.tenant, session_id=record.session_id, kind="egress", tool="proxy", call_id="",
            outcome=record.decision, permission="net.connect",
            patterns=(f"{record.host}:{record.port}",) if record.host else (),
            rule=refusal_rule(record.reason) if refused else "", detail=detail,
        )
        await (self._refusals if refused else self._audit).record(entry)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def trace_connection(record: ConnectionRecord, started_ns: int) -> None:
    """One `egress.connect` span from when the client asked to when the connection ended."""
    span = tracer.start_span(SPAN_CONNECT, start_time=started_ns, attributes={
        a.SESSION_ID: record.session_id, a.TENANT: record.tenant, HOST: record.host, PORT: record.port,
        ADDRESS: record.address, DECISION: record.decision, BYTES_UP: record.bytes_up,
        BYTES_DOWN: record.bytes_down, INTERCEPTED: record.intercepted,
    })
    if record.decision != "allowed":
        span.set_status(Status(StatusCode.ERROR, record.reason))
    span.end(end_time=time.time_ns())
