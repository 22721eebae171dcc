"""The snapshot and fork RPCs of controlplane.v1.SessionService (mixed into SessionService)."""

from __future__ import annotations

from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from controlplane.core.sessions.models import Resources, Session
from controlplane.core.sessions.snapshots import Snapshot
from controlplane.core.sessions.snapshotting import SessionSnapshots
from controlplane.core.tenants.quota import TenantQuotas, with_defaults
from controlplane.errors import FailedPreconditionError, InvalidArgumentError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import unary
from controlplane.v1 import session_pb2


def snapshot_to_proto(s: Snapshot) -> session_pb2.Snapshot:
    created = Timestamp()
    created.FromNanoseconds(int(s.created_at * 1e9))
    out = session_pb2.Snapshot(id=s.id, session_id=s.session_id, size_bytes=s.size_bytes, created_at=created,
                               template=s.template)
    if s.kind == "retained":  # kept at its session's end (pausing.py), until purge_at
        out.retained = True
        out.purge_at.FromNanoseconds(int(s.state.purge_at * 1e9))
    return out


def restore_only(request: session_pb2.CreateSessionRequest) -> None:
    """A restore takes everything from the snapshot: a request that also names any of it is refused, rather than
    one of the two silently winning."""
    given = [name for name in ("agent", "workspace_archive", "config_json", "template") if getattr(request, name)]
    given += ["labels"] if request.labels else []
    given += ["network"] if request.HasField("network") else []
    if given:
        raise InvalidArgumentError(
            f"from_snapshot restores the snapshot's {', '.join(given)}: leave them empty (only resources may be given)")


class SnapshotRpcs:
    _auth: Authenticator
    _quotas: TenantQuotas
    _snapshots: SessionSnapshots | None

    def _proto(self, session: Any) -> session_pb2.Session:
        raise NotImplementedError

    def _snapshotting(self) -> SessionSnapshots:
        if self._snapshots is None:
            raise FailedPreconditionError("this control plane keeps no snapshots")
        return self._snapshots

    async def _restore(self, tenant: str, request: session_pb2.CreateSessionRequest) -> Session:
        restore_only(request)
        snapshots = self._snapshotting()
        snapshot = await snapshots.get(tenant, request.from_snapshot)
        r = request.resources
        asked = Resources(r.cpu, r.memory_mb, r.pids) if request.HasField("resources") else None
        resources = with_defaults(asked, snapshot.state.resources)
        async with self._quotas.creating(tenant, resources):
            return await snapshots.restore(tenant, snapshot, resources)

    @unary
    async def SnapshotSession(self, request: session_pb2.SnapshotSessionRequest, context: Any) -> session_pb2.Snapshot:
        tenant = self._auth.tenant_of(context)
        return snapshot_to_proto(await self._snapshotting().snapshot(tenant.name, request.session_id))

    @unary
    async def ListSnapshots(
        self, request: session_pb2.ListSnapshotsRequest, context: Any
    ) -> session_pb2.ListSnapshotsResponse:
        tenant = self._auth.tenant_of(context)
        snapshots = await self._snapshotting().list(tenant.name)
        return session_pb2.ListSnapshotsResponse(snapshots=[snapshot_to_proto(s) for s in snapshots])

    @unary
    async def DeleteSnapshot(
        self, request: session_pb2.DeleteSnapshotRequest, context: Any
    ) -> session_pb2.DeleteSnapshotResponse:
        tenant = self._auth.tenant_of(context)
        deleted = await self._snapshotting().delete(tenant.name, request.snapshot_id)
        return session_pb2.DeleteSnapshotResponse(snapshot=snapshot_to_proto(deleted))

    @unary
    async def ForkSession(self, request: session_pb2.ForkSessionRequest, context: Any) -> session_pb2.Session:
        tenant = self._auth.tenant_of(context)
        snapshots = self._snapshotting()
        source = await snapshots.source(tenant.name, request.session_id)
        async with self._quotas.creating(tenant.name, source.resources):
            return self._proto(await snapshots.fork(tenant.name, request.session_id))
