"""Refusals a client causes at almost no cost (over its calls quota, a revoked token) are audited without
letting a flood of them become a flood of store writes: one row per window and key, then one counting the rest."""

from __future__ import annotations

import asyncio

from controlplane.core.permissions.audit import AuditEntry, CoalescedRefusals


class Recorded:
    def __init__(self) -> None:
        self.entries: list[AuditEntry] = []

    async def record(self, entry: AuditEntry) -> None:
        self.entries.append(entry)


def refusal(tenant: str, kind: str = "exec", detail: str = "quota") -> AuditEntry:
    return AuditEntry(tenant=tenant, session_id="", kind=kind, tool="exec", call_id="", outcome="denied",
                      rule="quota calls", detail=detail)


async def test_a_burst_is_one_row_and_a_count() -> None:
    log = Recorded()
    refusals = CoalescedRefusals(log, window_s=0.05)
    for i in range(50):
        await refusals.record(refusal("alpha", detail=f"used up {i}"))
    await refusals.record(refusal("beta"))
    await refusals.record(refusal("alpha", kind="call"))
    assert [(e.tenant, e.kind, e.detail) for e in log.entries] == [
        ("alpha", "exec", "used up 0"), ("beta", "exec", "quota"), ("alpha", "call", "quota"),
    ]
    await asyncio.sleep(0.15)
    assert [(e.tenant, e.detail) for e in log.entries[3:]] == [
        ("alpha", "used up 49 (49 more refused like this within 0.05 s)"),
    ]
    await refusals.record(refusal("alpha", detail="later"))  # a new window
    assert log.entries[-1].detail == "later"
