"""controlplane.v1.AuditService: a tenant reads its own audit record.

Its own means this tenant's, not its name's: the store keeps a deleted tenant's rows for the operator, and a
tenant created again under that name sees only what happened from its own creation on."""

from __future__ import annotations

from typing import Any

from controlplane.core.sessions.manager import SessionManager
from controlplane.core.tenants.records import hash_token
from controlplane.rpc.auth import Authenticator, bearer
from controlplane.rpc.errors import unary
from controlplane.store.base import AuditWriter, Store
from controlplane.v1 import audit_pb2, audit_pb2_grpc


class AuditService(audit_pb2_grpc.AuditServiceServicer):
    def __init__(self, store: Store, writer: AuditWriter, sessions: SessionManager, auth: Authenticator) -> None:
        self._store = store
        self._writer = writer
        self._sessions = sessions
        self._auth = auth

    @unary
    async def ListAudit(self, request: audit_pb2.ListAuditRequest, context: Any) -> audit_pb2.ListAuditResponse:
        tenant = self._auth.tenant_of(context)
        if request.session_id:
            await self._sessions.get(tenant.name, request.session_id)  # another tenant's: NOT_FOUND
        # Entries are written in batches: the caller sees what happened up to its request.
        await self._writer.flush()
        _, _, record = self._auth.directory.lookup(hash_token(bearer(context.invocation_metadata())))
        since = record.created_at if record is not None else 0.0
        entries = [e for e in await self._store.audit_entries(tenant.name, request.session_id) if e.time >= since]
        if request.limit:
            entries = entries[-request.limit:]
        return audit_pb2.ListAuditResponse(entries=[
            audit_pb2.AuditEntry(
                time=e.time, session_id=e.session_id, kind=e.kind, tool=e.tool, call_id=e.call_id, outcome=e.outcome,
                permission=e.permission, patterns=list(e.patterns), rule=e.rule, detail=e.detail,
            )
            for e in entries
        ])
