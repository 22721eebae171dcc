"""The audit record: every permission decision and every tool call's outcome, per tenant and session."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class AuditEntry:
    tenant: str
    session_id: str
    kind: str
    """`permission` (a decision) or `call` (a finished tool call)."""
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
