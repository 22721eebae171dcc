"""The audit record: every permission decision and every tool call's outcome, per tenant and session."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Protocol


@dataclass(frozen=True)
class AuditEntry:
    tenant: str
    session_id: str
    kind: str
    """`permission` (a decision), `call` (a finished or refused tool call), `exec` (an Exec's end, or its
    refusal before it started), `stdin` (what an Exec received), `egress` (a connection through the session's
    network proxy: controlplane/egress_proxy/accounting.py)."""
    tool: str
    call_id: str
    outcome: str
    """permission: allow, deny, once, always, reject, auto-always, cancelled; call: ok, error, cancelled, denied."""
    permission: str = ""
    patterns: tuple[str, ...] = ()
    rule: str = ""
    """The deciding rule as `permission pattern action` (with its source), or who replied."""
    detail: str = ""
    time: float = field(default_factory=time.time)


class AuditLog(Protocol):
    async def record(self, entry: AuditEntry) -> None: ...


class NoAudit:
    async def record(self, entry: AuditEntry) -> None:
        return None


class CoalescedRefusals:
    """Refusals a client can cause at almost no cost to itself (a call over its quota, a revoked token)
    become at most one row per `window_s` for each (tenant, kind, tool, rule): a flood of them must not turn
    into a flood of writes to the store. The ones left out are counted in one more row after the window."""

    def __init__(self, audit: AuditLog, window_s: float = 1.0) -> None:
        self._audit = audit
        self._window_s = window_s
        self._skipped: dict[tuple[str, str, str, str], tuple[AuditEntry, int]] = {}
        """Keys within their window: the last entry left out and how many were."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def record(self, entry: AuditEntry) -> None:
        key = (entry.tenant, entry.kind, entry.tool, entry.rule)
        if key in self._skipped:
            _, count = self._skipped[key]
            self._skipped[key] = (entry, count + 1)
            return
        self._skipped[key] = (entry, 0)
        # A timer, not a sleeping task: one pending when the loop stops is dropped without a warning.
        asyncio.get_running_loop().call_later(self._window_s, self._close_window, key)
        await self._audit.record(entry)

    def _close_window(self, key: tuple[str, str, str, str]) -> None:
        last, count = self._skipped.pop(key)
        if count:
            task = asyncio.ensure_future(self._audit.record(replace(
                last, detail=f"{last.detail} ({count} more refused like this within {self._window_s:g} s)",
                time=time.time(),
            )))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
