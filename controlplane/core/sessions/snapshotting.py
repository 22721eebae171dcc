"""Taking, restoring and forking sessions: a session's workspace and state, kept (SnapshotStorage) or copied
straight into a new session (fork).

A restore or a fork creates its session through `SessionManager.create`, like any CreateSession: the same
admission, template and network checks, and the workspace's project config is merged into the caller's again. So
the new session's custom tools and plugins are the workspace's at the time of the copy, as after ReloadTools:
taking a snapshot or a fork is the caller's act (these RPCs are not tools), never the model's.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import replace

from controlplane.core.permissions.asks import ApprovalStore
from controlplane.core.sessions.admission import CreateSpec
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.core.sessions.portable_tar import portable
from controlplane.core.sessions.services import TodoStore
from controlplane.core.sessions.snapshots import Snapshot, SnapshotState, SnapshotStorage, checked_id
from controlplane.core.tenants.quota import TenantQuotas
from controlplane.errors import FailedPreconditionError, NotFoundError, ResourceExhaustedError

TAKEN, PAUSED, RETAINED = "taken", "paused", "retained"
MIB = 1024 * 1024
PIECE = 1 << 20
log = logging.getLogger(__name__)


class SessionSnapshots:
    def __init__(self, sessions: SessionManager, storage: SnapshotStorage, todos: TodoStore,
                 approvals: ApprovalStore, quotas: TenantQuotas | None = None, max_per_tenant: int = 50) -> None:
        self._sessions = sessions
        self._storage = storage
        self._todos = todos
        self._approvals = approvals
        self._quotas = quotas or TenantQuotas.unlimited()
        self._max_per_tenant = max_per_tenant
        self._taking: dict[str, asyncio.Lock] = {}
        """One snapshot at a time per tenant (in this plane), so that the count and quota checks hold."""

    async def snapshot(self, tenant: str, session_id: str) -> Snapshot:
        async with self._taking.setdefault(tenant, asyncio.Lock()):
            return await self._snapshot(tenant, session_id)

    async def _snapshot(self, tenant: str, session_id: str) -> Snapshot:
        session, state = await self._source(tenant, session_id)
        kept = len([s for s in await self._storage.list(tenant) if s.kind == TAKEN])
        if kept >= self._max_per_tenant:
            raise ResourceExhaustedError(
                f"tenant {tenant} keeps {kept} snapshots, the most allowed (snapshots.max_per_tenant = "
                f"{self._max_per_tenant}); delete one first")
        sandbox = await self._sessions.sandbox_for(tenant, session_id)
        snapshot_id = "snap_" + secrets.token_hex(12)
        tar = await self._portable(session.id, sandbox.agent.download())
        taken = await self._storage.write(tenant, snapshot_id, session.id, state, _pieces(tar))
        try:
            await self._within_disk_quota(tenant)
        except ResourceExhaustedError:
            await self._storage.delete(tenant, snapshot_id)
            raise
        return taken

    @property
    def storage(self) -> SnapshotStorage:
        return self._storage

    async def list(self, tenant: str) -> list[Snapshot]:
        return [s for s in await self._storage.list(tenant) if s.kind != PAUSED]

    async def keep(self, session: Session, download: AsyncIterator[bytes], kind: str,
                   purge_at: float = 0.0) -> Snapshot:
        """Stores `session`'s workspace for the platform: a paused session's own, or an ending session's
        (retained). Neither counts toward max_per_tenant nor is refused by the disk quota: the tenant had that
        workspace already, and refusing would lose it."""
        todos = await self._todos.get_todos(session.id)
        approvals = await self._approvals.load_approvals(session.id)
        state = replace(SnapshotState.of(session, todos, approvals), kind=kind, purge_at=purge_at)
        tar = await self._portable(session.id, download)
        return await self._storage.write(session.tenant, "snap_" + secrets.token_hex(12), session.id, state,
                                         _pieces(tar))

    async def delete(self, tenant: str, snapshot_id: str) -> Snapshot:
        snapshot = await self._owned(tenant, snapshot_id)
        await self._storage.delete(tenant, snapshot.id)
        return snapshot

    async def get(self, tenant: str, snapshot_id: str) -> Snapshot:
        """The tenant's snapshot (another tenant's id is NOT_FOUND: it is looked up under this tenant only)."""
        return await self._owned(tenant, snapshot_id)

    async def restore(self, tenant: str, snapshot: Snapshot, resources: Resources) -> Session:
        """A new session from the tenant's snapshot (its checksum checked first)."""
        archive = await self._storage.read(tenant, snapshot.id)
        return await self._create(tenant, snapshot.state, archive, resources)

    async def source(self, tenant: str, session_id: str) -> Session:
        """The READY session a fork copies (it also tells the quota what the fork reserves)."""
        return (await self._source(tenant, session_id))[0]

    async def fork(self, tenant: str, session_id: str) -> Session:
        """A new session with a copy of the workspace and state, streamed from the source's agent into memory
        (nothing stored on disk); the copy is bounded by the expanded-size limit any workspace archive has. Both
        this and a snapshot leave out what no new session could take (portable_tar.py)."""
        _, state = await self._source(tenant, session_id)
        sandbox = await self._sessions.sandbox_for(tenant, session_id)
        archive = await self._portable(session_id, sandbox.agent.download())
        return await self._create(tenant, state, archive, state.resources)

    # -- internals ----------------------------------------------------------------------------------

    async def _source(self, tenant: str, session_id: str) -> tuple[Session, SnapshotState]:
        session = await self._sessions.get(tenant, session_id)  # NOT_FOUND for another tenant's
        if session.parent_id:
            raise FailedPreconditionError(
                f"session {session_id} is a child of {session.parent_id} and shares its sandbox: snapshot or fork "
                "the parent")
        if session.state != SessionState.READY:
            reason = f" ({session.status_message})" if session.status_message else ""
            raise FailedPreconditionError(f"session {session_id} is {session.state.value}{reason}: only a READY "
                                          "session can be snapshotted or forked")
        todos = await self._todos.get_todos(session.id)
        approvals = await self._approvals.load_approvals(session.id)
        return session, SnapshotState.of(session, todos, approvals)

    async def _portable(self, session_id: str, download: AsyncIterator[bytes]) -> bytes:
        tar = await _collect(download, self._sessions.policy.max_archive_expanded_bytes)
        made = await asyncio.to_thread(portable, tar)
        limit = self._sessions.policy.max_archive_entries
        if made.entries > limit:  # refused now: a snapshot no create would accept is no snapshot
            raise ResourceExhaustedError(
                f"session {session_id}'s workspace has {made.entries} entries; a session can be created from at most "
                f"{limit} (limits.max_archive_entries)")
        if made.dropped:
            log.warning("session %s: the copy of its workspace leaves out %s", session_id, "; ".join(made.dropped))
        return made.tar

    async def _owned(self, tenant: str, snapshot_id: str) -> Snapshot:
        snapshot = await self._storage.get(tenant, checked_id(snapshot_id))
        if snapshot is None or snapshot.kind == PAUSED:  # a paused session's own: its session resumes from it
            raise NotFoundError(f"snapshot {snapshot_id!r} not found")
        return snapshot

    async def _create(self, tenant: str, state: SnapshotState, archive: bytes, resources: Resources) -> Session:
        spec = CreateSpec(
            agent=state.agent, workspace_archive=archive, config_json=state.config_json, labels=dict(state.labels),
            resources=resources, template=state.template, network=state.network,
            archive_limit_bytes=max(len(archive), 1),
        )
        session = await self._sessions.create(tenant, spec)
        # Shielded: a caller gone now still leaves a session with all of its state, not a READY one without it.
        await asyncio.shield(self._restore_state(session.id, state))
        return replace(session)

    async def _restore_state(self, session_id: str, state: SnapshotState) -> None:
        if state.todos:
            await self._todos.put_todos(session_id, state.todos)
        if state.approvals:
            await self._approvals.add_approvals(session_id, state.rules())

    async def _within_disk_quota(self, tenant: str) -> None:
        """A tenant's snapshots count toward its `disk_mb` quota beside its live sessions' workspaces."""
        limit = self._quotas.quota(tenant).disk_mb
        if limit is None:
            return
        stored = sum(s.size_bytes for s in await self._storage.list(tenant))
        live_mb = (await self._quotas.usage(tenant)).disk_mb
        if live_mb * MIB + stored > limit * MIB:
            raise ResourceExhaustedError(
                f"tenant {tenant}'s disk quota of {limit} MiB would be exceeded: {live_mb} MiB reserved by live "
                f"sessions and {stored / MIB:.1f} MiB of snapshots with this one; delete a snapshot or a session")


async def _pieces(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for offset in range(0, len(view), PIECE):
        yield bytes(view[offset : offset + PIECE])


async def _collect(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    out = bytearray()
    async for chunk in chunks:
        out += chunk
        if len(out) > limit:
            raise ResourceExhaustedError(f"the workspace is larger than the {limit} bytes a copy may hold")
    return bytes(out)
