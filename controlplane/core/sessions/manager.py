"""Sessions: creation on a sandbox, ownership by tenant, lifetimes, and recovery after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from controlplane.core.calls.tracked_tasks import TrackedTasks
from controlplane.core.seam.messages import CodeChanges
from controlplane.core.seam.provider import LostSandbox, ReconcileReport, Sandbox, SandboxProvider
from controlplane.core.sessions import admission, expiry, network, reap_tasks, sandbox_setup, store_sync
from controlplane.core.sessions.admission import CreateSpec, SessionPolicy
from controlplane.core.sessions.capacity import HostCapacity, HostLedger
from controlplane.core.sessions.cpu_usage import CpuAccount, CpuStore
from controlplane.core.sessions.events import EventBus
from controlplane.core.sessions.liveness import fail_stored, still_answers
from controlplane.core.sessions.models import Session, SessionState
from controlplane.core.sessions.network import SessionNetworks
from controlplane.core.sessions.store_port import SessionStore
from controlplane.core.sessions.templates import TemplateAccess, TemplateInfo
from controlplane.errors import (
    ControlPlaneError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxError,
)
from controlplane.telemetry import attributes, spans

log = logging.getLogger(__name__)
TOUCH_WRITE_INTERVAL_S = 1.0
"""Activity is kept in memory and written to the store at most this often per session."""


class SessionManager:
    def __init__(
        self, store: SessionStore, provider: SandboxProvider, policy: SessionPolicy,
        clock: Callable[[], float] = time.time, bus: EventBus | None = None, host: HostLedger | None = None,
        cpu_store: CpuStore | None = None, networks: SessionNetworks | None = None,
    ) -> None:
        self.bus = bus or EventBus()
        self.host = host or HostLedger(HostCapacity(float("inf"), 1 << 62))
        """Host admission: unbounded unless the app gives the machine's capacity."""
        self._store = store
        self._provider = provider
        self.templates = TemplateAccess()
        """Which templates each tenant may use (the operator's `[[tenants]] templates`)."""
        self.cpu = CpuAccount(provider, cpu_store)
        """CPU-seconds per tenant (cpu_usage.py): without a store, only live sandboxes' are known."""
        self._policy = policy
        self._clock = clock
        self._live: dict[str, Session] = {}
        self._touched: dict[str, float] = {}
        self._touch_written: dict[str, float] = {}
        """When each session's activity was last stored (at most every TOUCH_WRITE_INTERVAL_S)."""
        self._reaper: asyncio.Task[None] | None = None
        self._ending = TrackedTasks()
        """Sessions being ended (sandbox removal, final state): awaited by `close`."""
        self._background = TrackedTasks()
        self._end_listeners: list[Callable[[str], None]] = []
        self._networks = networks
        self.reapers: list[Callable[[], Awaitable[None]]] = []  # pausing.py
        self.reaping = reap_tasks.ReapTasks()  # expiries, idle pauses (pausing.py)
        self.before_removal: Callable[[Session, SessionState, str], Awaitable[None]] | None = None
        spans.active_sessions.watch(self, lambda manager: len(manager._live))
        provider.on_lost(self._sandbox_lost)

    def on_end(self, listener: Callable[[str], None]) -> None:
        """Calls `listener(session_id)` whenever a session is deleted or fails."""
        self._end_listeners.append(listener)

    @property
    def policy(self) -> SessionPolicy:
        return self._policy

    @property
    def provider(self) -> SandboxProvider:
        return self._provider

    def expires_at(self, session: Session) -> float:
        return session.expires_at(self._policy.idle_timeout_s, self._policy.max_lifetime_s)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> ReconcileReport:
        """Adopts what the store knows, fails what cannot be recovered, starts the reaper."""
        live: dict[str, str] = {}
        children: list[Session] = []
        for session in await self._store.list_sessions(live_only=True):
            if session.parent_id:
                children.append(session)  # adopted with their parent, below
            elif session.state == SessionState.CREATING or not session.sandbox_id:
                await self._finish(session, SessionState.FAILED, "the control plane restarted while creating it")
            else:
                live[session.sandbox_id] = session.id
                self._live[session.id] = session
        # Failed, undeleted sessions keep their workspaces: reconciliation must not remove them.
        ended = await self._store.list_sessions()
        self._provider.retain(s.sandbox_id for s in ended if s.state == SessionState.FAILED and s.sandbox_id)
        report = await self._provider.start(live)
        foreign: set[str] = set()
        for sandbox_id, session_id in live.items():
            if sandbox_id not in report.adopted and sandbox_id not in report.lost:
                self._live.pop(session_id)  # another control plane on the same store owns it
                foreign.add(session_id)
        for sandbox_id in report.lost:
            session_id = live[sandbox_id]
            await self._finish(self._live.pop(session_id), SessionState.FAILED, "its sandbox was lost")
        for sandbox_id in report.adopted:  # their forwarders survived; their proxies did not
            adopted = self._live[live[sandbox_id]]
            if failure := await network.reopen(self._networks, self._provider, adopted):
                await self._end(adopted, SessionState.FAILED, failure)
        for child in children:  # in creation order, so a parent comes before its children
            if child.parent_id in self._live:
                self._live[child.id] = child
            elif child.parent_id in foreign:
                foreign.add(child.id)  # its parent's plane holds it too
            else:
                await self._finish(child, SessionState.FAILED, f"its parent session {child.parent_id} ended")
        # Only what this plane adopted: other planes' sessions are booked under their own leases.
        await self.host.start(s.id for s in self._live.values() if not s.parent_id)
        rounds = reap_tasks.rounds(self._policy.reap_interval_s, lambda: [self._start_expiries, *self.reapers])
        self._reaper = asyncio.get_running_loop().create_task(rounds)
        return report

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        await self.reaping.close()
        await self._ending.wait()  # sessions whose callers went away finish ending before the engine closes
        await self.host.close()
        for session_id, at in list(self._touched.items()):
            await self._store.touch_session(session_id, at)
        if self._networks is not None:
            await self._networks.close_all()
        await self._provider.close()

    # -- API ------------------------------------------------------------------------------------

    async def create(self, tenant: str, spec: CreateSpec) -> Session:
        admission.resources(self._policy, spec.resources)  # a request the host could never run: refused first
        with spans.span(attributes.SPAN_CREATE_SESSION, {attributes.TENANT: tenant}) as span:
            async with self.host.admitting(len(spec.workspace_archive)) as keep:
                session = await self._create(tenant, spec)
                await keep(session.id)  # its reservation is held until the session ends
            spans.set_attributes(span, {attributes.SESSION_ID: session.id, attributes.SANDBOX_ID: session.sandbox_id})
            return session

    async def _create(self, tenant: str, spec: CreateSpec) -> Session:
        # Everything the request alone can be refused for is checked before anything exists: a refused
        # create leaves no session, sandbox or store row behind (the caller never got an id for one).
        resources = admission.resources(self._policy, spec.resources)
        template = self.templates.check(tenant, spec.template, self._provider.templates())
        if spec.network is not None:
            network.check(self._networks, self._provider, tenant, spec.network)
        config_json, caller_config, agent = await admission.session_config(self._policy, spec)
        now = self._clock()
        session = Session(
            id="ses_" + secrets.token_hex(12), tenant=tenant, agent=agent,
            state=SessionState.CREATING, resources=resources, created_at=now, last_active_at=now,
            labels=dict(spec.labels or {}), config_json=config_json,
            caller_config_json=caller_config, template=template, network=spec.network,
        )
        try:
            with spans.span(attributes.SPAN_ACQUIRE_SANDBOX, {attributes.SESSION_ID: session.id}) as acquiring:
                sandbox = await self._provider.acquire(session.id, tenant, resources, template)
                spans.acquired(acquiring, sandbox.id, sandbox.from_pool)
        except ControlPlaneError as exc:
            # Not the request's fault (no engine, hardening refused): kept as a FAILED session to look at.
            await self._finish(session, SessionState.FAILED, str(exc))
            raise
        session.sandbox_id = sandbox.id
        try:  # the sandbox and network are gone when this fails
            await sandbox_setup.fill(self._networks, self._provider, session, sandbox, spec.workspace_archive,
                                     config_json)
        except (InvalidArgumentError, ResourceExhaustedError, FailedPreconditionError) as exc:
            log.info("session %s not created: %s", session.id, exc)  # the agent's own checks: leave nothing
            raise
        except ControlPlaneError as exc:
            await self._finish(session, SessionState.FAILED, f"workspace upload failed: {exc}")
            raise
        # Stored only now: a restart in between removes the claimed sandbox of no known session.
        # Held first: a caller gone during the write (shielded, it still lands) leaves a READY session this
        # plane serves and reaps when idle, not one the store has and no plane holds.
        session.state = SessionState.READY
        self._live[session.id] = session
        try:
            await asyncio.shield(self._store.put_session(session))
        except Exception:
            self._live.pop(session.id, None)
            await asyncio.shield(self._close_network(session))
            await asyncio.shield(self._provider.destroy(sandbox.id))
            raise
        self.bus.publish("session.created", tenant, session.id, id=session.id, agent=session.agent,
                         sandboxID=session.sandbox_id)
        return replace(session)

    async def create_child(self, parent_id: str, agent: str, title: str) -> Session:
        """A READY session on the parent's sandbox (no new container), ended with its parent."""
        parent = self._live.get(parent_id)
        if parent is None or parent.state != SessionState.READY:
            raise FailedPreconditionError(f"session {parent_id} is not running")
        now = self._clock()
        child = Session(
            id="ses_" + secrets.token_hex(12), tenant=parent.tenant, agent=agent, state=SessionState.READY,
            resources=parent.resources, created_at=now, last_active_at=now, sandbox_id=parent.sandbox_id,
            config_json=parent.config_json, parent_id=parent.id, title=title,
            caller_config_json=parent.caller_config_json, template=parent.template,
        )
        await self._store.put_session(child)
        self._live[child.id] = child
        self.bus.publish("session.created", child.tenant, child.id, id=child.id, agent=agent,
                         sandboxID=child.sandbox_id, parentID=parent.id, title=title)
        return replace(child)

    def list_templates(self, tenant: str) -> list[TemplateInfo]:
        """The templates `tenant` may use, with their states."""
        return self.templates.visible(tenant, self._provider.templates())

    def live_child(self, parent_id: str, child_id: str) -> Session | None:
        """The running child `child_id` of `parent_id`, if there is one."""
        child = self._live.get(child_id)
        if child is None or child.parent_id != parent_id or child.state != SessionState.READY:
            return None
        return replace(child)

    def live_session(self, session_id: str) -> Session | None:
        session = self._live.get(session_id)
        return replace(session) if session is not None else None

    async def get(self, tenant: str, session_id: str) -> Session:
        session = self._live.get(session_id) or await self._store.get_session(session_id)
        if session is None or session.tenant != tenant:
            raise NotFoundError(f"session {session_id!r} not found")
        return replace(session, last_active_at=self._touched.get(session_id, session.last_active_at))

    async def list_sessions(self, tenant: str, include_deleted: bool = False) -> list[Session]:
        sessions = await self._store.list_sessions(tenant)
        out = []
        for s in sessions:
            if s.state == SessionState.DELETED and not include_deleted:
                continue
            out.append(replace(s, last_active_at=self._touched.get(s.id, s.last_active_at)))
        return out

    async def delete(self, tenant: str, session_id: str, message: str = "deleted") -> Session:
        session = await self.get(tenant, session_id)
        if session.state == SessionState.DELETED:
            return session
        return await self._end(session, SessionState.DELETED, message)

    async def park(self, session: Session, message: str) -> Session:
        """The sandbox goes, the session stays PAUSED (pausing.py)."""
        if (held := self._live.get(session.id)) is None:
            raise FailedPreconditionError(f"session {session.id} is not running")
        return await self._end(held, SessionState.PAUSED, message)

    async def unpark(self, session: Session, archive: bytes, put: Callable[[Session], Awaitable[None]]) -> CodeChanges:
        """A PAUSED session on a new sandbox, stored by `put`; a failure leaves it PAUSED."""
        sandbox = await self._provider.acquire(session.id, session.tenant, session.resources, session.template)
        changes = await sandbox_setup.fill(self._networks, self._provider, session, sandbox, archive,
                                           session.config_json)
        session.sandbox_id, session.state, session.status_message = sandbox.id, SessionState.READY, ""
        session.last_active_at = self._clock()
        self._live[session.id] = session
        try:
            await asyncio.shield(put(session))
        except Exception:
            self._live.pop(session.id, None)
            await asyncio.shield(self._remove_sandbox(session, None))
            raise
        return changes

    async def cpu_seconds(self, tenant: str) -> float:
        """CPU time of the tenant's sandboxes, removed and live (those this plane holds)."""
        live = [s.sandbox_id for s in self._live.values() if s.tenant == tenant and not s.parent_id and s.sandbox_id]
        return await self.cpu.total(tenant, live)

    async def sandbox_for(self, tenant: str, session_id: str) -> Sandbox:
        """The READY session's sandbox; marks the session active."""
        session = self._live.get(session_id)
        if session is None or session.tenant != tenant:
            session = await self.get(tenant, session_id)  # raises NotFound for strangers
            if session.state == SessionState.READY and session.sandbox_id:
                return await self._attached_sandbox(session)
            raise FailedPreconditionError(
                f"session {session_id} is {session.state.value}"
                + (f" ({session.status_message})" if session.status_message else "")
            )
        if session.state != SessionState.READY:
            raise FailedPreconditionError(f"session {session_id} is {session.state.value}")
        try:
            sandbox = await self._provider.get(session.sandbox_id)
        except SandboxError as exc:
            await self._end(self._root(session), SessionState.FAILED, str(exc))
            raise
        self._touch(session_id)
        return sandbox

    async def report_lost(self, session_id: str, reason: str) -> None:
        """Called when a sandbox stops answering mid-call: the session fails only if its agent is really gone (a
        call's broken stream alone does not say so), and its workspace is kept for the caller (`_wind_up`)."""
        session = self._live.get(session_id)
        if session is None:
            return
        root = self._root(session)
        if await still_answers(self._provider, root.sandbox_id):
            log.warning("session %s: a call lost its sandbox stream (%s); the agent answers: kept", root.id, reason)
            return
        if self._live.get(root.id) is root:
            await self._end(root, SessionState.FAILED, reason)

    async def _sandbox_lost(self, lost: LostSandbox) -> None:
        """The provider found the sandbox gone: its session fails with the provider's reason, as when a call finds
        it gone (one not held here fails in the shared store: `fail_stored`)."""
        held = self._live.get(lost.session_id)
        if held is None:
            await fail_stored(self._store, lost)
        elif held.sandbox_id == lost.sandbox_id and held.state == SessionState.READY:
            await self._end(held, SessionState.FAILED, lost.reason)


    async def _close_network(self, session: Session) -> None:
        if session.network is not None and self._networks is not None:
            await self._networks.close(session.id)

    def _touch(self, session_id: str) -> None:
        now = self._clock()
        self._touched[session_id] = now
        last_written = self._touch_written.get(session_id)
        session = self._live.get(session_id)
        if session is not None:
            session.last_active_at = now
            if session.parent_id:  # a parent waiting on its child's work is not idle
                self._touch(session.parent_id)
        if last_written is None or now - last_written >= TOUCH_WRITE_INTERVAL_S:
            self._touch_written[session_id] = now
            self._background.start(self._store.touch_session(session_id, now))

    def _root(self, session: Session) -> Session:
        """The session that owns `session`'s sandbox."""
        while session.parent_id and session.parent_id in self._live:
            session = self._live[session.parent_id]
        return session

    async def _end(self, session: Session, state: SessionState, message: str) -> Session:
        # A READY session this plane does not hold is another plane's: its owner removes the sandbox
        # when it sees the new state (`_sync_with_store`).
        held = self._live.pop(session.id, None)
        foreign = held is None and session.state == SessionState.READY
        self._touched.pop(session.id, None)
        self._touch_written.pop(session.id, None)
        # Shielded and tracked: a caller giving up (a deadline, shutdown) must not leave the sandbox removed
        # halfway, or the store saying READY of a session no plane holds.
        return await self._ending.run(self._wind_up(session, state, message, foreign, held))

    async def _wind_up(
        self, session: Session, state: SessionState, message: str, foreign: bool, held: Session | None
    ) -> Session:
        for child in [s for s in self._live.values() if s.parent_id == session.id]:
            await self._end(child, state, f"its parent session {session.id} ended ({message})")
        if session.sandbox_id and not session.parent_id and not foreign:  # a child borrows its parent's
            if self.before_removal is not None:
                await self.before_removal(session, state, message)
            await self._remove_sandbox(session, held, keep_workspace=state == SessionState.FAILED)
        if not session.parent_id:  # only once the sandbox is gone; a child reserves nothing
            await self.host.release(session.id)
        return await self._finish(session, state, message)

    async def _remove_sandbox(self, session: Session, held: Session | None, *, keep_workspace: bool = False) -> None:
        """Removes the session's sandbox; if that fails, the session is held again, so that the next delete, look
        at the store or reaper round tries again. A failed session keeps its workspace (the user's work) until it
        is deleted: then `destroy` removes what `retire` left."""
        await self.cpu.settle(session.tenant, session.sandbox_id)
        await self._close_network(session)
        try:
            if keep_workspace:
                await self._provider.retire(session.sandbox_id)
            else:
                await self._provider.destroy(session.sandbox_id)
        except Exception as exc:
            if held is not None:
                self._live.setdefault(session.id, held)
            # Said here too: a caller that went away no longer reports it.
            log.warning("removing the sandbox of session %s failed, it stays held: %s", session.id, exc)
            raise

    async def _finish(self, session: Session, state: SessionState, message: str) -> Session:
        session.state = state
        session.status_message = message
        session.deleted_at = self._clock() if state == SessionState.DELETED else None
        if state == SessionState.PAUSED:
            session.sandbox_id = ""  # a resume gives it another
        await self._store.put_session(session)
        for listener in self._end_listeners:
            listener(session.id)
        kinds = {SessionState.DELETED: "session.deleted", SessionState.PAUSED: "session.paused"}
        self.bus.publish(kinds.get(state, "session.failed"), session.tenant, session.id, id=session.id, message=message)
        return replace(session)

    async def _attached_sandbox(self, session: Session) -> Sandbox:
        """The sandbox of a READY session another control plane owns (they share the store)."""
        try:
            sandbox = await self._provider.attach(session.sandbox_id)
        except SandboxError as exc:
            raise FailedPreconditionError(
                f"session {session.id} is held by another control plane and cannot be reached from this one: {exc}"
            ) from exc
        self._touch(session.id)
        return sandbox

    async def _ended_elsewhere(self, session: Session, ended: Session) -> None:
        self._live.pop(session.id, None)
        await self.host.release(session.id)  # the plane that ended it released it too; this plane forgets it
        self._touched.pop(session.id, None)
        self._touch_written.pop(session.id, None)
        for child in [s for s in self._live.values() if s.parent_id == session.id]:
            await self._end(child, ended.state, f"its parent session {session.id} ended ({ended.status_message})")
        if session.sandbox_id and not session.parent_id:
            await self._remove_sandbox(session, session)
        for listener in self._end_listeners:
            listener(session.id)
        kind = "session.deleted" if ended.state == SessionState.DELETED else "session.failed"
        self.bus.publish(kind, session.tenant, session.id, id=session.id, message=ended.status_message)

    async def reap_expired(self) -> list[str]:
        """One round of expiries, awaited: the ids of the sessions it ended."""
        return await reap_tasks.succeeded(await self._start_expiries())

    async def _start_expiries(self) -> dict[str, asyncio.Task[Any]]:  # not awaited by the reaper's rounds
        await store_sync.sync(self._store, self._live, self._ended_elsewhere)
        started = {}
        for session, why in expiry.due(list(self._live.values()), self._policy, self._clock()):
            if task := self.reaping.start(session.tenant, session.id, functools.partial(self._expire, session, why)):
                started[session.id] = task
        return started

    async def _expire(self, session: Session, reason: str) -> bool:
        if self._live.get(session.id) is not session:  # ended meanwhile by its parent's end
            return False
        await self._end(session, SessionState.DELETED, reason)  # failing, it is retried
        return True
