"""Pausing and resuming sessions, and keeping an ending session's workspace (docs/lifecycle.md).

A pause stores the session's workspace with the snapshot machinery (a snapshot of kind "paused", which only its
session sees) and removes the sandbox; the session keeps its id and everything the store holds for it (config,
todos, approvals, network policy), so a resume needs only a new sandbox and that workspace. Nothing of the pause
depends on the provider keeping a volume on one host: a resume lands wherever the provider (or Swarm) places the
new sandbox, and takes a warm one from the pool when the session's resources and template allow.

The order of the writes is what makes a restart harmless. A pause writes the workspace first, then removes the
sandbox, then stores PAUSED: a restart before the removal leaves a READY session (adopted as any) and a stray
"paused" snapshot; one between the removal and the state write, a READY session without a sandbox. `round` keeps
such a stray workspace as a retained snapshot (when `lifetime.retain_s` allows) before removing it. A resume claims
a sandbox and only then stores READY: a restart in between leaves the session PAUSED and resumable, and the
claimed sandbox of a session that is not live, which reconciliation removes.

Paused and retained workspaces are bounded per tenant by `snapshots.max_per_tenant` each, and with taken snapshots
by the disk quota (which counts a paused session by its stored bytes): a tenant cannot escape its session quota by
pausing without end, nor fill the disk by deleting with keep_snapshot. Each count and the store it admits happen
under the tenant's turn (tenant_turns.py), taken after the session's lock, never before. A paused session ends as
expired after `lifetime.max_paused_s`, timed from its stored workspace's creation (so a restart does not reset it).

Resuming loads the workspace's custom tools and plugins as they are then, like ReloadTools: a resume is the
caller's act (the platform pauses idle sessions by itself, but never resumes one), and the `session.resumed` event
lists the code files the resumed session runs, so that a caller can see what a model may have written meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from controlplane.core.sessions.expiry import EXPIRED
from controlplane.core.sessions.liveness import still_answers
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Session, SessionState
from controlplane.core.sessions.resume_claims import ResumeClaims
from controlplane.core.sessions.session_locks import SessionLocks
from controlplane.core.sessions.snapshots import Snapshot, SnapshotStorage
from controlplane.core.sessions.snapshotting import PAUSED, RETAINED, SessionSnapshots
from controlplane.core.sessions.store_port import SessionStore
from controlplane.errors import ControlPlaneError, CopyLapsedError, FailedPreconditionError, ResourceExhaustedError

log = logging.getLogger(__name__)
PAUSED_MESSAGE = "call ResumeSession to run it again"
"""A paused session's status message: every refused call on it says so (`session X is PAUSED (...)`)."""
STRAY_AFTER_S = 600.0
"""A "paused" snapshot whose session is not PAUSED is removed after this long (a pause may be writing it)."""
SCAN_INTERVAL_S = 60.0
"""How often the reaper reads the snapshot storage for retained snapshots to purge and stray paused ones."""
RETRY_PAUSE_S = 60.0
LAPSED_RETRY_S = 1800.0
AGENT_COPY_TIMEOUT_S = 60.0
"""How long an ending session's agent may take to send its kept copy before its volume is read instead (a model
can stop and start the archiver, which runs as the tool user, to make it trickle)."""
SALVAGE_TIMEOUT_S = 300.0
"""The most an ending session's kept copy may take in all (its turn, the agent's copy, the volume's read): a stuck
engine must not hold the end for good."""


class SessionPauses:
    def __init__(self, sessions: SessionManager, snapshots: SessionSnapshots, storage: SnapshotStorage,
                 store: SessionStore, pause_after_idle_s: float = 0.0, retain_s: float = 0.0,
                 max_per_tenant: int = 50, clock: Callable[[], float] = time.time, max_paused_s: float = 0.0,
                 instance: str = "default") -> None:
        self._sessions = sessions
        self._snapshots = snapshots
        self._storage = storage
        self._store = store
        self._pause_after_idle_s = pause_after_idle_s
        self.retain_s = retain_s
        self._max_per_tenant = max_per_tenant
        self._max_paused_s = max_paused_s
        self._clock = clock
        self._claims = ResumeClaims(store, instance, clock)
        self._locks = SessionLocks()
        self._retry_at: dict[str, float] = {}
        """Idle sessions whose pause failed: not tried again before then."""
        # The snapshot storage is read whole each scan: often enough for retain_s and max_paused_s, never more than
        # every reap round.
        self._scan_interval_s = min([SCAN_INTERVAL_S] + [t for t in (retain_s, max_paused_s) if t > 0])
        self._next_scan = 0.0
        sessions.before_removal = self._before_removal
        sessions.reapers.append(self.round)

    # -- API --

    async def pause(self, tenant: str, session_id: str) -> Session:
        async with self._locks.hold(session_id):
            session = await self._sessions.get(tenant, session_id)  # NOT_FOUND for another tenant's
            if session.state == SessionState.PAUSED:
                return session
            await self._pausable(session)
            async with self._snapshots.turns.turn(tenant):  # the count, the store and the disk check together
                if len(await self._kept(tenant, PAUSED)) >= self._max_per_tenant:
                    raise ResourceExhaustedError(
                        f"tenant {tenant} has {self._max_per_tenant} paused sessions, the most allowed "
                        "(snapshots.max_per_tenant); resume or delete one first")
                sandbox = await self._sessions.sandbox_for(tenant, session_id)
                kept = await self._snapshots.keep(session, sandbox.agent.download(), PAUSED)
                await self._within_disk(tenant, kept, freed_live=1, what="paused workspace")
            try:
                paused = await self._sessions.park(session, PAUSED_MESSAGE)
            except BaseException:
                held = self._sessions.live_session(session_id)
                if held is not None and held.state == SessionState.READY:  # still running: its copy is stray
                    await asyncio.shield(self._storage.delete(tenant, kept.id))
                raise
            log.info("session %s paused (workspace %s, %d bytes)", session_id, kept.id, kept.size_bytes)
            return paused

    async def get_paused(self, tenant: str, session_id: str) -> Session | None:
        """The tenant's session if it is PAUSED (what a resume reserves), None if it is in another state."""
        session = await self._sessions.get(tenant, session_id)
        return session if session.state == SessionState.PAUSED else None

    async def resume(self, tenant: str, session_id: str) -> Session:
        async with self._locks.hold(session_id):
            session = await self._sessions.get(tenant, session_id)
            if session.state == SessionState.READY:
                return session
            if session.state != SessionState.PAUSED:
                raise FailedPreconditionError(
                    f"session {session_id} is {session.state.value}: only a PAUSED session can be resumed")
            done = await self._claims.claim(session_id, lambda: self._sessions.get(tenant, session_id))
            if done is not None:  # another plane resumed it meanwhile
                return done
            try:
                return await self._resume(tenant, session)
            except BaseException:
                with contextlib.suppress(ControlPlaneError, OSError):  # else a stale claim expires by age
                    await asyncio.shield(self._claims.release(session_id))
                raise

    async def _resume(self, tenant: str, session: Session) -> Session:
        session_id = session.id
        kept = await self._own_workspace(tenant, session_id)
        if kept is None:
            raise FailedPreconditionError(
                f"session {session_id} is PAUSED but its stored workspace is missing; delete the session")
        async with self._snapshots.stored(tenant, kept.id) as archive, \
                self._sessions.host.admitting(len(archive)) as keep_reservation:  # a damaged one is refused
            changes = await self._sessions.unpark(session, archive, self._claims.store_resumed)
            await keep_reservation(session.id)
        with contextlib.suppress(ControlPlaneError, OSError):  # a leftover is removed by `round`
            await self._storage.delete(tenant, kept.id)
        self._sessions.bus.publish("session.resumed", tenant, session_id, id=session_id,
                                   sandboxID=session.sandbox_id, codeLoaded=changes.added + changes.changed)
        return await self._sessions.get(tenant, session_id)

    async def delete(self, tenant: str, session_id: str, keep_snapshot: bool) -> tuple[Session, Snapshot | None]:
        """DeleteSession; with `keep_snapshot`, the workspace and state are first kept as a retained snapshot
        (a READY session's from its sandbox, a PAUSED one's from its stored workspace; a FAILED one's is the one
        kept when it failed). A workspace that cannot be kept fails the call and deletes nothing."""
        if keep_snapshot and self.retain_s <= 0:
            raise FailedPreconditionError(
                "this control plane keeps no workspace after a session ends (lifetime.retain_s = 0): take a "
                "snapshot with SnapshotSession first, then delete")
        async with self._locks.hold(session_id):
            session = await self._sessions.get(tenant, session_id)
            kept = await self._keep_for_delete(session) if keep_snapshot else None
            try:
                deleted = await self._sessions.delete(tenant, session_id)
            except BaseException:
                if kept is not None and session.state != SessionState.FAILED:  # not deleted: kept for nothing
                    await asyncio.shield(self._storage.delete(tenant, kept.id))
                raise
            if (own := await self._own_workspace(tenant, session_id)) is not None:
                await self._storage.delete(tenant, own.id)
            return deleted, kept

    async def _keep_for_delete(self, session: Session) -> Snapshot:
        if session.parent_id:
            raise FailedPreconditionError(f"session {session.id} is a child of {session.parent_id} and has no "
                                          "workspace of its own: keep the parent's")
        if session.state == SessionState.FAILED:
            kept = await self._retained_of(session)
            if kept is None:
                raise FailedPreconditionError(f"session {session.id} is FAILED and no workspace of it was kept")
            return kept
        if session.state not in (SessionState.READY, SessionState.PAUSED):
            raise FailedPreconditionError(f"session {session.id} is {session.state.value}: nothing to keep")
        if session.state == SessionState.READY and self._sessions.live_session(session.id) is None:
            raise FailedPreconditionError(
                f"session {session.id} runs on another control plane: delete it through that one")
        async with self._snapshots.turns.turn(session.tenant):  # the count, the store and the disk check together
            if len(await self._kept(session.tenant, RETAINED)) >= self._max_per_tenant:
                raise ResourceExhaustedError(
                    f"tenant {session.tenant} keeps {self._max_per_tenant} retained snapshots, the most allowed "
                    "(snapshots.max_per_tenant); delete one first")
            if session.state == SessionState.PAUSED:
                own = await self._own_workspace(session.tenant, session.id)
                kept = await self._retain_paused(session)
                freed_bytes, freed_live = (own.size_bytes if own is not None else 0), 0
            else:
                sandbox = await self._sessions.sandbox_for(session.tenant, session.id)
                kept = await self._snapshots.keep(session, sandbox.agent.download(), RETAINED, self._purge_at())
                freed_bytes, freed_live = 0, 1
            await self._within_disk(session.tenant, kept, freed_live=freed_live, freed_bytes=freed_bytes,
                                    what="retained workspace")
            return kept

    async def _within_disk(self, tenant: str, kept: Snapshot, *, freed_live: int = 0, freed_bytes: int = 0,
                           what: str) -> None:
        """The disk quota's check of a workspace just stored, which goes again when it would leave the tenant over
        its quota (what the act frees, the pausing session's live workspace or the paused one's stored copy, is
        counted as freed)."""
        try:
            await self._snapshots.quotas.admit_stored(tenant, kept.size_bytes, freed_live=freed_live,
                                                      freed_bytes=freed_bytes, what=what)
        except ResourceExhaustedError:
            await asyncio.shield(self._storage.delete(tenant, kept.id))
            raise

    # -- the reaper's round --

    async def round(self) -> None:
        """Pauses idle sessions (lifetime.pause_after_idle_s); every `_scan_interval_s`, purges retained snapshots
        past their time and removes "paused" snapshots no PAUSED session owns (a crash mid-pause, a session ended
        by its tenant's deletion)."""
        now = self._clock()
        if self._pause_after_idle_s > 0:
            await self._pause_idle(now)
        if now >= self._next_scan:
            self._next_scan = now + self._scan_interval_s
            await self._scan(now)

    async def _pause_idle(self, now: float) -> None:
        for stored in await self._store.list_sessions(live_only=True):
            held = self._sessions.live_session(stored.id)
            if held is None or held.parent_id or held.state != SessionState.READY:
                continue
            if now < held.last_active_at + self._pause_after_idle_s or now < self._retry_at.get(held.id, 0.0):
                continue
            # Its own task (reap_tasks.py): a pause whose copy stalls must not hold up the other sessions'.
            self._sessions.reaping.start(held.tenant, held.id, functools.partial(self._pause_idle_one, held, now))

    async def _pause_idle_one(self, held: Session, now: float) -> None:
        try:
            await self.pause(held.tenant, held.id)
        except CopyLapsedError as exc:
            # Its sandbox held a copy turn, sending too little: asked every minute, it would hold one each time
            # (such agents in two tenants held every copy); an honest slow one is still paused later.
            self._retry_at[held.id] = now + LAPSED_RETRY_S
            log.warning("idle session %s is not paused: its sandbox let the workspace copy lapse (%s)", held.id, exc)
        except ControlPlaneError as exc:  # it runs on; the idle timeout still ends it
            self._retry_at[held.id] = now + RETRY_PAUSE_S  # not every round: a refusal would fill the log
            log.warning("pausing idle session %s failed (again in %g s): %s", held.id, RETRY_PAUSE_S, exc)
        else:
            self._retry_at.pop(held.id, None)

    async def _scan(self, now: float) -> None:
        for tenant in await self._storage.tenants():
            for snapshot in await self._storage.list(tenant):
                if snapshot.kind == RETAINED and snapshot.state.purge_at and now >= snapshot.state.purge_at:
                    await self._storage.delete(tenant, snapshot.id)
                    log.info("retained snapshot %s of session %s purged", snapshot.id, snapshot.session_id)
                elif snapshot.kind == PAUSED and 0 < self._max_paused_s <= now - snapshot.created_at:
                    await self._expire_paused(tenant, snapshot)
                elif (snapshot.kind == PAUSED and now >= snapshot.created_at + STRAY_AFTER_S
                      and not self._locks.held(snapshot.session_id)):
                    owner = await self._store.get_session(snapshot.session_id)
                    if owner is None or owner.state != SessionState.PAUSED:
                        await self._stray(tenant, snapshot, owner)

    async def _expire_paused(self, tenant: str, snapshot: Snapshot) -> None:
        """A session paused for `lifetime.max_paused_s` (timed from its stored workspace, which a restart keeps) ends
        as an expired live session does: its workspace becomes a retained snapshot when `lifetime.retain_s` says
        so, and is deleted with it otherwise. One that is not PAUSED any more leaves a stray, `_stray`'s case."""
        async with self._locks.hold(snapshot.session_id):
            owner = await self._store.get_session(snapshot.session_id)
            if owner is None or owner.state != SessionState.PAUSED or owner.tenant != tenant:
                if self._clock() >= snapshot.created_at + STRAY_AFTER_S:  # no pause of it is writing it now
                    await self._stray(tenant, snapshot, owner)
                return
            message = f"{EXPIRED}paused for {self._max_paused_s:g} s"
            if self.retain_s > 0:
                try:
                    kept = await self._retain_ending(owner, self._retain_paused)
                except (ControlPlaneError, OSError) as exc:  # it ends either way: storage is what it must free
                    log.warning("paused session %s ends (%s) without its workspace kept: %s", owner.id, message, exc)
                else:
                    log.info("paused session %s ends (%s): workspace kept as %s", owner.id, message, kept.id)
            await self._sessions.delete(tenant, owner.id, message)
            await self._storage.delete(tenant, snapshot.id)

    async def _stray(self, tenant: str, snapshot: Snapshot, owner: Session | None) -> None:
        # A crash mid-pause may have removed the sandbox before PAUSED was stored: the session is then READY (or
        # FAILED) without its workspace, which stays, as a retained snapshot.
        if owner is not None and owner.state in (SessionState.READY, SessionState.FAILED) and self.retain_s > 0:
            with contextlib.suppress(ControlPlaneError, OSError):
                await self._retain_ending(owner, self._retain_paused)  # bounded as any ending session's
        await self._storage.delete(tenant, snapshot.id)

    # -- internals --

    async def _pausable(self, session: Session) -> None:
        if session.parent_id:
            raise FailedPreconditionError(
                f"session {session.id} is a child of {session.parent_id} and runs on its sandbox: pause the parent")
        if session.state != SessionState.READY:
            reason = f" ({session.status_message})" if session.status_message else ""
            raise FailedPreconditionError(
                f"session {session.id} is {session.state.value}{reason}: only a READY session can be paused")
        if self._sessions.live_session(session.id) is None:
            raise FailedPreconditionError(
                f"session {session.id} runs on another control plane: pause it through that one")
        children = [s.id for s in await self._store.list_sessions(session.tenant, live_only=True)
                    if s.parent_id == session.id]
        if children:  # they run on its sandbox: a pause would end them
            raise FailedPreconditionError(
                f"session {session.id} has running subagent sessions ({', '.join(children)}): pause it when their "
                "task calls are over")

    async def _own_workspace(self, tenant: str, session_id: str) -> Snapshot | None:
        mine = [s for s in await self._storage.list(tenant) if s.kind == PAUSED and s.session_id == session_id]
        return mine[-1] if mine else None

    async def _kept(self, tenant: str, kind: str) -> list[Snapshot]:
        return [s for s in await self._storage.list(tenant) if s.kind == kind]

    async def _retained_of(self, session: Session) -> Snapshot | None:
        mine = [s for s in await self._storage.list(session.tenant)
                if s.kind == RETAINED and s.session_id == session.id]
        return mine[-1] if mine else None

    async def _retain_paused(self, session: Session) -> Snapshot:
        own = await self._own_workspace(session.tenant, session.id)
        if own is None:
            raise FailedPreconditionError(f"session {session.id} is PAUSED but its stored workspace is missing")
        return await self._snapshots.keep(replace(session), self._storage.workspace(session.tenant, own.id), RETAINED,
                                          self._purge_at(), from_sandbox=False)

    def _purge_at(self) -> float:
        return self._clock() + self.retain_s

    async def _keep_ending(self, session: Session) -> Snapshot:
        return await self._retain_ending(session, self._salvage)

    async def _salvage(self, session: Session) -> Snapshot:
        provider = self._sessions.provider
        if await still_answers(provider, session.sandbox_id):
            download = (await provider.get(session.sandbox_id)).agent.download()
            # Bounded where the volume outlives the sandbox: else the agent is the only way to the work
            bound = AGENT_COPY_TIMEOUT_S if await provider.keeps_workspace(session.sandbox_id) else None
            try:
                return await asyncio.wait_for(self._snapshots.keep(session, download, RETAINED, self._purge_at()),
                                              bound)
            except CopyLapsedError as exc:  # a stalling agent: its volume holds the same work
                log.warning("session %s: its sandbox let the kept copy lapse (%s); its volume is read", session.id, exc)
            except TimeoutError:  # a trickling or slow agent: the same
                log.warning("session %s: its kept copy took over %g s; its volume is read", session.id,
                            AGENT_COPY_TIMEOUT_S)
        # The agent is gone (or stalled): the container goes first, then its kept volume is read without it.
        await provider.retire(session.sandbox_id)
        return await self._snapshots.keep(session, provider.salvage(session.sandbox_id), RETAINED, self._purge_at(),
                                          from_sandbox=False)

    async def _retain_ending(self, session: Session, store: Callable[[Session], Awaitable[Snapshot]]) -> Snapshot:
        """An ending session's workspace kept as a retained snapshot (`store` writes it), under the tenant's turn:
        the oldest retained ones go first so that the tenant keeps at most max_per_tenant, the newest end among
        them. Not refused by the disk quota: the tenant held that workspace already, and refusing would lose it;
        its creates are refused meanwhile."""
        async with self._snapshots.turns.turn(session.tenant):
            retained = await self._kept(session.tenant, RETAINED)
            for oldest in retained[: max(0, len(retained) - self._max_per_tenant + 1)]:
                await self._storage.delete(session.tenant, oldest.id)
                log.info("retained snapshot %s purged early: tenant %s keeps at most %d", oldest.id, session.tenant,
                         self._max_per_tenant)
            return await store(session)

    async def _before_removal(self, session: Session, state: SessionState, message: str) -> None:
        """An ending session's workspace, while its sandbox is still there: kept when it expired or failed (and
        `lifetime.retain_s` says so). Never raised: the session ends either way, and a workspace that cannot be
        read is said in the log."""
        ending = state == SessionState.FAILED or (state == SessionState.DELETED and message.startswith(EXPIRED))
        if self.retain_s <= 0 or not ending:
            return
        try:  # bounded: a stuck engine must not hold the session's end
            kept = await asyncio.wait_for(self._keep_ending(session), SALVAGE_TIMEOUT_S)
        except Exception as exc:  # any failure (the engine's, a damaged tar's): the session must still end
            log.warning("session %s ends (%s) without its workspace kept: %s", session.id, message, exc)
            return
        log.info("session %s ends (%s): workspace kept as %s until %.0f", session.id, message, kept.id,
                 kept.state.purge_at)

