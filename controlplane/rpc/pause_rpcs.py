"""The pause, resume and keep-on-delete RPCs of controlplane.v1.SessionService (mixed into SessionService)."""

from __future__ import annotations

from typing import Any

from controlplane.core.sessions.pausing import SessionPauses
from controlplane.core.tenants.quota import TenantQuotas
from controlplane.errors import FailedPreconditionError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import unary
from controlplane.rpc.snapshot_rpcs import snapshot_to_proto
from controlplane.v1 import session_pb2


class PauseRpcs:
    _auth: Authenticator
    _quotas: TenantQuotas
    _pauses: SessionPauses | None

    def _proto(self, session: Any) -> session_pb2.Session:
        raise NotImplementedError

    def _pausing(self) -> SessionPauses:
        if self._pauses is None:
            raise FailedPreconditionError("this control plane cannot pause sessions (it keeps no snapshots)")
        return self._pauses

    @unary
    async def PauseSession(self, request: session_pb2.PauseSessionRequest, context: Any) -> session_pb2.Session:
        tenant = self._auth.tenant_of(context)
        return self._proto(await self._pausing().pause(tenant.name, request.session_id))

    @unary
    async def ResumeSession(self, request: session_pb2.ResumeSessionRequest, context: Any) -> session_pb2.Session:
        tenant = self._auth.tenant_of(context)
        pauses = self._pausing()
        # Admitted as a create is: what the pause gave back to the quota may have been taken since.
        paused = await pauses.get_paused(tenant.name, request.session_id)
        if paused is None:
            return self._proto(await pauses.resume(tenant.name, request.session_id))
        async with self._quotas.creating(tenant.name, paused.resources):
            return self._proto(await pauses.resume(tenant.name, request.session_id))

    async def _delete(
        self, tenant: str, request: session_pb2.DeleteSessionRequest
    ) -> session_pb2.DeleteSessionResponse:
        session, kept = await self._pausing().delete(tenant, request.session_id, request.keep_snapshot)
        out = session_pb2.DeleteSessionResponse(session=self._proto(session))
        if kept is not None:
            out.snapshot.CopyFrom(snapshot_to_proto(kept))
        return out
