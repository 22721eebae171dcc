"""controlplane.v1.SessionService."""

from __future__ import annotations

from typing import Any

from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.pausing import SessionPauses
from controlplane.core.sessions.snapshotting import SessionSnapshots
from controlplane.core.tenants.quota import QuotaExceededError, TenantQuotas, with_defaults
from controlplane.errors import InvalidArgumentError, ResourceExhaustedError
from controlplane.rpc import convert
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import unary
from controlplane.rpc.pause_rpcs import PauseRpcs
from controlplane.rpc.snapshot_rpcs import SnapshotRpcs
from controlplane.v1 import session_pb2, session_pb2_grpc


class SessionService(SnapshotRpcs, PauseRpcs, session_pb2_grpc.SessionServiceServicer):
    def __init__(self, sessions: SessionManager, auth: Authenticator, quotas: TenantQuotas | None = None,
                 snapshots: SessionSnapshots | None = None, pauses: SessionPauses | None = None) -> None:
        self._sessions = sessions
        self._auth = auth
        self._quotas = quotas or TenantQuotas.unlimited()
        self._snapshots = snapshots
        self._pauses = pauses

    def _proto(self, session: Any) -> session_pb2.Session:
        return convert.session_to_proto(session, self._sessions.expires_at(session))

    @unary
    async def CreateSession(self, request: session_pb2.CreateSessionRequest, context: Any) -> session_pb2.Session:
        tenant = self._auth.tenant_of(context)
        if request.from_snapshot:
            return self._proto(await self._restore(tenant.name, request))
        spec = convert.create_spec(request)
        resources = with_defaults(spec.resources, self._sessions.policy.defaults)
        # A held refusal keeps the archive three times: the parsed request, gRPC's bytes off the wire, the spec.
        held = 3 * len(spec.workspace_archive or b"")
        try:
            async with self._quotas.creating(tenant.name, resources, held):
                return self._proto(await self._sessions.create(tenant.name, spec))
        except (InvalidArgumentError, ResourceExhaustedError) as exc:
            # A refused request (an archive bomb, a bad spec) is held like a quota's refusal (held already):
            # a client sending bombs in a loop made 300 a second, half a CPU of the plane every tenant shares.
            if not isinstance(exc, QuotaExceededError):
                await self._quotas.pause_refusal(tenant.name, held)
            raise

    @unary
    async def GetSession(self, request: session_pb2.GetSessionRequest, context: Any) -> session_pb2.Session:
        tenant = self._auth.tenant_of(context)
        return self._proto(await self._sessions.get(tenant.name, request.session_id))

    @unary
    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: Any
    ) -> session_pb2.ListSessionsResponse:
        tenant = self._auth.tenant_of(context)
        sessions = await self._sessions.list_sessions(tenant.name, request.include_deleted)
        return session_pb2.ListSessionsResponse(sessions=[self._proto(s) for s in sessions])

    @unary
    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: Any
    ) -> session_pb2.DeleteSessionResponse:
        tenant = self._auth.tenant_of(context)
        if self._pauses is not None:  # a paused session's stored workspace goes too (or is kept)
            return await self._delete(tenant.name, request)
        session = await self._sessions.delete(tenant.name, request.session_id)
        return session_pb2.DeleteSessionResponse(session=self._proto(session))

    @unary
    async def ListTemplates(
        self, request: session_pb2.ListTemplatesRequest, context: Any
    ) -> session_pb2.ListTemplatesResponse:
        tenant = self._auth.tenant_of(context)
        templates = self._sessions.list_templates(tenant.name)
        return session_pb2.ListTemplatesResponse(templates=[convert.template_to_proto(t) for t in templates])
