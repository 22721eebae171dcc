"""A session's network traffic as the operator and the tenant see it over the API: AdminService.GetUsage
reports the tenant's proxy bytes, and AuditService lists each connection (kind `egress`) with its bytes and
decision. The proxy is started here as the session wiring starts it, fed by the plane's own accounting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.egress import EgressPolicy
from controlplane.egress_proxy.proxy import SessionProxy
from controlplane.egress_proxy.rules import NetworkRules
from controlplane.egress_proxy.types import ByteMeter
from controlplane.v1 import audit_pb2, audit_pb2_grpc
from tests.egress.support import HttpUpstream, Seen, response
from tests.planes import Plane, served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [{"name": "acme", "token": "token-acme-egress"},
                                 {"name": "beta", "token": "token-beta-egress"}]
plane = served_plane("local", tenants=TENANTS, pool={"size": 0},
                     egress={"allow_cidrs": ["127.0.0.1/32"], "hosts": {"files.test": "127.0.0.1"}})
clients = tenant_clients(TENANTS)


@pytest.fixture
async def admin(plane: Plane) -> AsyncIterator[AsyncAdminClient]:
    token = plane.plane.settings.admin_token_file.read_text().strip()
    async with AsyncAdminClient(plane.plane.address, token) as client:
        yield client


async def start_session_proxy(plane: Plane, tenant: str, session_id: str, path: Path) -> SessionProxy:
    settings = plane.plane.settings.egress
    accounting = plane.plane.egress
    assert accounting is not None
    proxy = SessionProxy(
        session_id=session_id, tenant=tenant, rules=NetworkRules(["files.test"]),
        guard=EgressPolicy(tuple(settings.allow_cidrs), tuple(settings.allow_hosts)), static_hosts=settings.hosts,
        meter=ByteMeter(settings.session_budget_bytes), credentials=settings.credential_list(), interceptor=None,
        on_record=accounting.record,
    )
    await proxy.start(path)
    return proxy


async def fetch(path: Path, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(raw)
    data = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    return data


async def list_audit(plane: Plane, token: str, session_id: str) -> list[audit_pb2.AuditEntry]:
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        reply = await stub.ListAudit(audit_pb2.ListAuditRequest(session_id=session_id),
                                     metadata=(("authorization", f"Bearer {token}"),))
    return [e for e in reply.entries if e.kind == "egress"]


async def test_usage_and_audit_show_a_sessions_network_bytes(
        plane: Plane, clients: dict[str, AsyncClient], admin: AsyncAdminClient, tmp_path: Path) -> None:
    upstream = await HttpUpstream().start()

    async def dataset(_: Seen) -> bytes:
        return response(200, b"d" * 300_000)

    upstream.routes["/dataset"] = dataset
    port = upstream.port
    before = (await admin.usage("acme")).egress_bytes
    session = await clients["acme"].create_session()
    proxy = await start_session_proxy(plane, "acme", session.id, tmp_path / "egress.sock")
    try:
        got = await fetch(proxy_path := tmp_path / "egress.sock",
                          f"GET http://files.test:{port}/dataset HTTP/1.1\r\nConnection: close\r\n\r\n"
                          .encode())
        refused = await fetch(proxy_path, b"GET http://elsewhere.test/ HTTP/1.1\r\n\r\n")
    finally:
        await proxy.close()
        await upstream.close()
    assert got.endswith(b"d" * 300_000)
    assert refused.startswith(b"HTTP/1.1 403")
    usage = await admin.usage("acme")
    assert usage.egress_bytes - before == proxy.meter.total > 300_000
    assert (await admin.usage("beta")).egress_bytes == 0
    for _ in range(50):  # the audit row is written by a task of its own
        rows = await list_audit(plane, "token-acme-egress", session.id)
        if len(rows) == 2:
            break
        await asyncio.sleep(0.05)
    allowed, denied = sorted(rows, key=lambda e: e.outcome)
    assert (allowed.outcome, list(allowed.patterns)) == ("allowed", [f"files.test:{port}"])
    assert f"{proxy.meter.down} bytes down" in allowed.detail
    assert (denied.outcome, list(denied.patterns), denied.rule) == (
        "refused", ["elsewhere.test:80"], "session network policy")
    # Another tenant does not see them.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await list_audit(plane, "token-beta-egress", session.id)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
