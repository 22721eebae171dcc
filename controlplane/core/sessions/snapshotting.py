"""Taking, restoring and forking sessions: a session's workspace and state, kept (SnapshotStorage) or copied
straight into a new session (fork).

A restore or a fork creates its session through `SessionManager.create`, like any CreateSession: the same
admission, template and network checks, and the workspace's project config is merged into the caller's again. So
the new session's custom tools and plugins are the workspace's at the time of the copy, as after ReloadTools:
taking a snapshot or a fork is the caller's act (these RPCs are not tools), never the model's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from controlplane.core.permissions.asks import ApprovalStore
from controlplane.core.sessions.admission import CreateSpec, kept_config
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.core.sessions.portable_tar import portable_file
from controlplane.core.sessions.services import TodoStore
from controlplane.core.sessions.snapshots import Snapshot, SnapshotState, SnapshotStorage, checked_id
from controlplane.core.sessions.tenant_turns import TenantTurns
from controlplane.core.sessions.workspace_spool import WorkspaceSpool, fill, finished, pieces, read_whole
from controlplane.core.tenants.quota import TenantQuotas
from controlplane.errors import FailedPreconditionError, NotFoundError, ResourceExhaustedError

TAKEN, PAUSED, RETAINED = "taken", "paused", "retained"
MIB = 1024 * 1024
log = logging.getLogger(__name__)


class SessionSnapshots:
    def __init__(self, sessions: SessionManager, storage: SnapshotStorage, todos: TodoStore,
                 approvals: ApprovalStore, quotas: TenantQuotas | None = None, max_per_tenant: int = 50,
                 spool: WorkspaceSpool | None = None) -> None:
        self._sessions = sessions
        self._storage = storage
        self._todos = todos
        self._approvals = approvals
        self._quotas = quotas or TenantQuotas.unlimited()
        self._max_per_tenant = max_per_tenant
        self._spool = spool or WorkspaceSpool(Path(tempfile.gettempdir()) / f"ocsb-spool-{os.getpid()}")
        """Where workspace copies are spooled (the plane gives one under its data dir), and how many at once."""
        self.turns = TenantTurns()
        """One check-then-store of a tenant's kept workspaces at a time (pauses and retentions take it too), so
        that the count and quota checks hold."""

    @property
    def quotas(self) -> TenantQuotas:
        return self._quotas

    async def snapshot(self, tenant: str, session_id: str) -> Snapshot:
        async with self.turns.turn(tenant):
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
        async with self._portable(tenant, session.id, sandbox.agent.download()) as tar:
            taken = await self._storage.write(tenant, snapshot_id, session.id, state, pieces(tar))
        try:
            await self._quotas.admit_stored(tenant, taken.size_bytes)
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
                   purge_at: float = 0.0, *, from_sandbox: bool = True) -> Snapshot:
        """Stores `session`'s workspace for the platform: a paused session's own, or an ending session's
        (retained). Neither counts toward max_per_tenant nor is refused by the disk quota: the tenant had that
        workspace already, and refusing would lose it. `from_sandbox`: `download` is its agent's, held to
        copy_pace's floor while other tenants wait (not a stored workspace or a salvaged volume, the plane's own)."""
        todos = await self._todos.get_todos(session.id)
        approvals = await self._approvals.load_approvals(session.id)
        state = replace(SnapshotState.of(session, todos, approvals), kind=kind, purge_at=purge_at)
        async with self._portable(session.tenant, session.id, download, from_sandbox) as tar:
            return await self._storage.write(session.tenant, "snap_" + secrets.token_hex(12), session.id, state,
                                             pieces(tar))

    async def delete(self, tenant: str, snapshot_id: str) -> Snapshot:
        snapshot = await self._owned(tenant, snapshot_id)
        await self._storage.delete(tenant, snapshot.id)
        return snapshot

    async def get(self, tenant: str, snapshot_id: str) -> Snapshot:
        """The tenant's snapshot (another tenant's id is NOT_FOUND: it is looked up under this tenant only)."""
        return await self._owned(tenant, snapshot_id)

    async def restore(self, tenant: str, snapshot: Snapshot, resources: Resources) -> Session:
        """A new session from the tenant's snapshot (its checksum checked first)."""
        async with self.stored(tenant, snapshot.id) as archive:
            return await self._create(tenant, snapshot.state, archive, resources)

    @contextlib.asynccontextmanager
    async def stored(self, tenant: str, snapshot_id: str) -> AsyncIterator[bytes]:
        """A stored workspace, read whole (its checksum checked) within one of the plane's copy turns, held while
        the caller uses it: concurrent restores and resumes hold no more workspaces in memory than copies run."""
        async with self._spool.turn(tenant):
            yield await self._storage.read(tenant, snapshot_id)

    async def source(self, tenant: str, session_id: str) -> Session:
        """The READY session a fork copies (it also tells the quota what the fork reserves)."""
        return (await self._source(tenant, session_id))[0]

    async def fork(self, tenant: str, session_id: str) -> Session:
        """A new session with a copy of the workspace and state, streamed from the source's agent through a spool
        file (nothing stored); the copy is bounded by the expanded-size limit any workspace archive has. Both this
        and a snapshot leave out what no new session could take (portable_tar.py)."""
        _, state = await self._source(tenant, session_id)
        sandbox = await self._sessions.sandbox_for(tenant, session_id)
        async with self._portable(tenant, session_id, sandbox.agent.download()) as tar:
            # A create takes its archive whole: read once from the spool (not gathered, then copied), and within
            # the copy's turn, so that the plane's concurrent copies bound this memory too.
            return await self._create(tenant, state, await read_whole(tar), state.resources)

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

    @contextlib.asynccontextmanager
    async def _portable(self, tenant: str, session_id: str, download: AsyncIterator[bytes],
                        from_sandbox: bool = True) -> AsyncIterator[Path]:
        """The workspace `download` gives, spooled to a file and made portable: the file's path, removed after. A
        sandbox's download gives its copy turn up when it sends too slowly while another tenant waits (fill)."""
        async with self._spool.turn(tenant) as turn, self._spool.file("workspace") as raw, \
                self._spool.file("portable") as copy:
            await fill(raw, download, self._sessions.policy.max_archive_expanded_bytes, turn if from_sandbox else None)
            stop = threading.Event()  # a cancel frees the files and the turn only after the pass, stopped early
            # Past the entries a create takes, refused now: a snapshot no create would accept is no snapshot.
            limit = self._sessions.policy.max_archive_entries
            try:
                made = await finished(portable_file, raw, copy, stop, limit, on_cancel=stop.set)
            except ResourceExhaustedError as exc:
                raise ResourceExhaustedError(f"session {session_id}'s workspace cannot be copied: {exc}") from exc
            if made.dropped:
                log.warning("session %s: the copy of its workspace leaves out %s", session_id,
                            "; ".join(made.dropped))
            yield made.path

    async def _owned(self, tenant: str, snapshot_id: str) -> Snapshot:
        snapshot = await self._storage.get(tenant, checked_id(snapshot_id))
        if snapshot is None or snapshot.kind == PAUSED:  # a paused session's own: its session resumes from it
            raise NotFoundError(f"snapshot {snapshot_id!r} not found")
        return snapshot

    async def _create(self, tenant: str, state: SnapshotState, archive: bytes, resources: Resources) -> Session:
        spec = CreateSpec(
            agent=state.agent, workspace_archive=archive, config_json=state.config_json, labels=dict(state.labels),
            resources=resources, template=state.template, network=state.network,
            archive_limit_bytes=max(len(archive), 1), kept_config=kept_config(state),
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

