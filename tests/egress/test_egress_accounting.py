"""EgressAccounting: every connection the proxy answers becomes an audit row (kind `egress`), a span and
counter points by tenant; bytes add up per session and per tenant, and a tenant's total is kept in the store
(past its sessions and the control plane's restarts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.egress_proxy.accounting import EgressAccounting
from controlplane.egress_proxy.types import ConnectionRecord
from controlplane.store.base import AuditWriter
from controlplane.store.sqlite import SqliteStore
from tests.egress.support import HttpUpstream, Seen, response, start_proxy
from tests.tracing import memory_exporter
from tests.unit.test_telemetry import console_spans, run_python


def record(session_id: str = "ses_1", tenant: str = "acme", *, host: str = "pypi.test", decision: str = "allowed",
           reason: str = "", up: int = 0, down: int = 0) -> ConnectionRecord:
    return ConnectionRecord(session_id=session_id, tenant=tenant, host=host, port=443,
                            address="203.0.113.9" if decision == "allowed" else "", decision=decision,
                            reason=reason, bytes_up=up, bytes_down=down, intercepted=False)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = await asyncio.to_thread(SqliteStore, tmp_path / "cp.db")
    yield opened
    await opened.aclose()


async def test_connections_become_audit_rows_with_bytes_and_decision(store: SqliteStore) -> None:
    writer = AuditWriter(store)
    accounting = EgressAccounting(writer, store)
    accounting.record(record(up=120, down=4096))
    accounting.record(record(host="evil.test", decision="refused",
                             reason="ocsb egress: host evil.test (port 443) is not in this session's network policy"))
    await accounting.close()
    await writer.close()
    rows = [e for e in await store.audit_entries("acme", "ses_1") if e.kind == "egress"]
    assert [(e.outcome, e.patterns, e.permission) for e in rows] == [
        ("allowed", ("pypi.test:443",), "net.connect"), ("refused", ("evil.test:443",), "net.connect")]
    assert rows[0].detail == "address 203.0.113.9; 120 bytes up, 4096 bytes down"
    assert rows[1].rule == "session network policy"
    assert "is not in this session's network policy" in rows[1].detail


async def test_a_flood_of_refusals_makes_few_audit_rows(store: SqliteStore) -> None:
    writer = AuditWriter(store)
    accounting = EgressAccounting(writer, store)
    for i in range(500):  # a sandbox varying the host to defeat coalescing by host
        accounting.record(record(host=f"h{i}.evil.test", decision="refused",
                                 reason=f"ocsb egress: host h{i}.evil.test is not in this session's network policy"))
    await accounting.close()
    await writer.close()
    rows = [e for e in await store.audit_entries("acme") if e.kind == "egress"]
    assert len(rows) == 2
    assert rows[1].detail.endswith("(499 more refused like this within 1 s)")


async def test_bytes_add_up_per_session_and_per_tenant_and_outlive_the_session(store: SqliteStore) -> None:
    writer = AuditWriter(store)
    accounting = EgressAccounting(writer, store)
    accounting.record(record("ses_1", up=100, down=1000))
    accounting.record(record("ses_1", up=10, down=10))
    accounting.record(record("ses_2", up=5, down=5))
    accounting.record(record("ses_3", tenant="beta", down=7))
    assert accounting.session_bytes("ses_1") == 1120
    assert accounting.session_totals("ses_1") == (110, 1010, 2)
    assert await accounting.tenant_bytes("acme") == 1130
    await accounting.forget("ses_1")
    assert accounting.session_bytes("ses_1") == 0
    # A new accounting (a restarted control plane) reads the tenant's total back from the store.
    await accounting.close()
    await writer.close()
    again = EgressAccounting(writer, store)
    assert await again.tenant_bytes("acme") == 1130
    assert await again.tenant_bytes("beta") == 7
    # The restarted plane's proxy for an adopted session goes on from the stored figure, and adds to it.
    assert await again.stored_session_bytes("ses_1") == 1120
    again.record(record("ses_1", down=80))
    assert await again.stored_session_bytes("ses_1") == 1200
    assert await again.tenant_bytes("acme") == 1210
    await again.close()
    await writer.close()


async def test_the_proxy_feeds_the_accounting_and_the_span(tmp_path: Path, store: SqliteStore) -> None:
    upstream = await HttpUpstream().start()

    async def payload(_: Seen) -> bytes:
        return response(200, b"z" * 50_000)

    upstream.routes["/file"] = payload
    exporter = memory_exporter()
    exporter.clear()
    writer = AuditWriter(store)
    accounting = EgressAccounting(writer, store)
    p = await start_proxy(tmp_path, allow_hosts=["allowed.test"], operator_cidrs=["127.0.0.1/32"],
                          static_hosts={"allowed.test": "127.0.0.1"})
    p.proxy.on_record = accounting.record
    try:
        got = await p.exchange(f"GET http://allowed.test:{upstream.port}/file HTTP/1.1\r\nConnection: close\r\n\r\n"
                               .encode())
    finally:
        await p.proxy.close()
        await upstream.close()
    assert got.endswith(b"z" * 50_000)
    assert await accounting.tenant_bytes("acme") == p.proxy.meter.total > 50_000
    await accounting.close()
    await writer.close()
    [row] = [e for e in await store.audit_entries("acme", "s-1") if e.kind == "egress"]
    assert row.outcome == "allowed"
    assert f"{p.proxy.meter.down} bytes down" in row.detail
    [span] = [s for s in exporter.get_finished_spans() if s.name == "egress.connect"]
    attributes: dict[str, Any] = dict(span.attributes or {})
    assert attributes["sandbox.session.id"] == "s-1"
    assert attributes["sandbox.tenant"] == "acme"
    assert attributes["sandbox.egress.host"] == "allowed.test"
    assert attributes["sandbox.egress.address"] == "127.0.0.1"
    assert attributes["sandbox.egress.bytes.down"] == p.proxy.meter.down


def test_counters_carry_the_tenant() -> None:
    done = run_python("""
        import asyncio
        from controlplane.egress_proxy.accounting import EgressAccounting
        from controlplane.egress_proxy.types import ConnectionRecord
        from controlplane.core.permissions.audit import NoAudit
        handle = setup.configure()

        async def main():
            accounting = EgressAccounting(NoAudit())
            for tenant, decision, down in (("acme", "allowed", 300), ("acme", "refused", 0), ("beta", "allowed", 5)):
                accounting.record(ConnectionRecord("s", tenant, "h.test", 80, "", decision, "", 20, down, False))
            await accounting.close()

        asyncio.run(main())
        handle.shutdown()
    """, OTEL_METRICS_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    points: dict[str, dict[tuple[str, ...], Any]] = {}
    for document in console_spans(done.stderr):
        for resource in document.get("resource_metrics", []):
            for scope in resource["scope_metrics"]:
                for metric in [m for m in scope["metrics"] if m["name"].startswith("ocsandbox.egress.")]:
                    for point in metric["data"]["data_points"]:
                        key = tuple(sorted(point["attributes"].values()))
                        points.setdefault(metric["name"], {})[key] = point["value"]
    assert points["ocsandbox.egress.connections"] == {
        ("acme", "allowed"): 1, ("acme", "refused"): 1, ("allowed", "beta"): 1}
    assert points["ocsandbox.egress.bytes"] == {
        ("acme", "up"): 40, ("acme", "down"): 300, ("beta", "up"): 20, ("beta", "down"): 5}
