"""AuditService: a tenant reads its own record, never another tenant's (whose session is NOT_FOUND)."""

from __future__ import annotations

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.v1 import audit_pb2, audit_pb2_grpc
from tests.archives import tar_of
from tests.planes import Plane, served_plane, tenant_clients

TENANTS = [{"name": "alice", "token": "alice-audit-token"}, {"name": "bob", "token": "bob-audit-token"}]
plane = served_plane("local", tenants=TENANTS)
clients = tenant_clients(TENANTS)


async def list_audit(plane: Plane, token: str, session_id: str = "") -> list[audit_pb2.AuditEntry]:
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        response = await stub.ListAudit(audit_pb2.ListAuditRequest(session_id=session_id),
                                        metadata=(("authorization", f"Bearer {token}"),))
    return list(response.entries)


async def test_each_tenant_reads_only_its_own_record(plane: Plane, clients: dict[str, AsyncClient]) -> None:
    mine = await clients["alice"].create_session(workspace_archive=tar_of({"a.txt": "a\n"}))
    theirs = await clients["bob"].create_session(workspace_archive=tar_of({"b.txt": "b\n"}))
    assert (await clients["alice"].execute_tool(mine.id, "read", {"filePath": "a.txt"})).result is not None
    assert (await clients["bob"].execute_tool(theirs.id, "read", {"filePath": "b.txt"})).result is not None
    alice = await list_audit(plane, TENANTS[0]["token"])
    assert {e.session_id for e in alice} == {mine.id}
    assert any(e.kind == "call" and e.tool == "read" and e.outcome == "ok" for e in alice)
    of_session = await list_audit(plane, TENANTS[0]["token"], mine.id)
    assert [(e.call_id, e.kind) for e in of_session] == [(e.call_id, e.kind) for e in alice]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await list_audit(plane, TENANTS[0]["token"], theirs.id)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await list_audit(plane, "not-a-token")
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_tenant_made_again_under_a_deleted_ones_name_reads_none_of_its_record(plane: Plane) -> None:
    # The store keeps the deleted tenant's rows for the operator; the new tenant's record starts at its creation.
    admin = AsyncAdminClient(plane.plane.address, plane.plane.settings.admin_token_file.read_text().strip())
    async with admin:
        first = await admin.create_tenant("carol")
        async with AsyncClient(plane.plane.address, first.token) as old:
            session = await old.create_session(workspace_archive=tar_of({"secret.txt": "old tenant\n"}))
            done = await old.run(session.id, command="echo old-tenant-command-line")
            assert done.exit_code == 0
            assert (await old.execute_tool(session.id, "read", {"filePath": "secret.txt"})).result is not None
        before = await list_audit(plane, first.token)
        assert any("old-tenant-command-line" in e.detail + " ".join(e.patterns) for e in before), before
        await admin.delete_tenant("carol")
        again = await admin.create_tenant("carol")
        assert await list_audit(plane, again.token) == []
        async with AsyncClient(plane.plane.address, again.token) as new:
            mine = await new.create_session(workspace_archive=tar_of({"a.txt": "a\n"}))
            assert (await new.execute_tool(mine.id, "read", {"filePath": "a.txt"})).result is not None
        assert {e.session_id for e in await list_audit(plane, again.token)} == {mine.id}
