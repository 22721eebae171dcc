"""Per-tenant quotas and the accounting they are checked against; no transport, no store.

A quota bounds what one tenant may hold at once: live sessions and what they reserve (CPU, memory,
workspace disk), concurrent calls (ExecuteTool streams and Execs) and concurrent event subscriptions.
Sessions are counted from what the session manager's store says is live, plus creations under way,
so two concurrent creates cannot both take the last slot; calls and subscriptions exist only in
this process, so they are counted here.

Disk counts every workspace the tenant holds: each running session's workspace disk, and the stored bytes of
each of its snapshots, taken, paused (a PAUSED session's workspace) and retained (an ended session's). A paused
session counts its stored bytes only, not also a live workspace: it has none until it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.core.tenants.call_share import CallShare
from controlplane.core.tenants.refusals import BURST, RefusalGate
from controlplane.core.tenants.refusals import REFUSAL_PAUSE_S as REFUSAL_PAUSE_S  # where tests and callers look
from controlplane.errors import ResourceExhaustedError

UNLIMITED = -1
"""A quota value that lifts a limit set below it (the global default or the tenant's TOML entry)."""
KEYS = ("sessions", "cpu", "memory_mb", "disk_mb", "calls", "subscriptions")
MIB = 1024 * 1024
MAX_PAUSED = BURST
"""Refusals of one tenant answered together after REFUSAL_PAUSE_S; the rest wait their turn
(controlplane.core.tenants.refusals)."""


class QuotaExceededError(ResourceExhaustedError):
    """A tenant's quota would be exceeded: the message names the quota, the use and the limit."""


@dataclass(frozen=True)
class Quota:
    """None: not limited at this layer (a lower layer's value, if any, stays)."""

    sessions: int | None = None
    cpu: float | None = None
    memory_mb: int | None = None
    disk_mb: int | None = None
    calls: int | None = None
    subscriptions: int | None = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> Quota:
        values = dict(values or {})
        unknown = set(values) - set(KEYS)
        if unknown:
            raise ValueError(f"unknown quota keys {sorted(unknown)}; known: {', '.join(KEYS)}")
        out: dict[str, Any] = {}
        for key, value in values.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"quota.{key} must be a number, got {value!r}")
            if value < 0 and value != UNLIMITED:
                raise ValueError(f"quota.{key} must be >= 0 (or {UNLIMITED} for unlimited), got {value}")
            out[key] = float(value) if key == "cpu" else int(value)
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def over(self, lower: Quota) -> Quota:
        """This layer's values on top of `lower`'s; UNLIMITED here clears a limit below."""
        merged: dict[str, Any] = {}
        for key in KEYS:
            mine, theirs = getattr(self, key), getattr(lower, key)
            merged[key] = theirs if mine is None else mine
        return Quota(**merged)

    def effective(self) -> Quota:
        """The limits in force: UNLIMITED becomes None."""
        return Quota(**{k: (None if getattr(self, k) == UNLIMITED else getattr(self, k)) for k in KEYS})


@dataclass
class Usage:
    sessions: int = 0
    cpu: float = 0.0
    memory_mb: int = 0
    disk_mb: int = 0
    """Running sessions' workspace disk and stored workspaces (`stored_bytes`, rounded up to a MiB)."""
    calls: int = 0
    calls_started: int = 0
    subscriptions: int = 0
    stored_bytes: int = 0
    """Of the tenant's snapshots of every kind (taken, paused, retained), as stored (compressed)."""
    cpu_seconds: float = 0.0
    """CPU time used by the tenant's sandboxes, removed ones included (filled in by TenantAdmin)."""
    egress_bytes: int = 0
    """Bytes through the tenant's sessions' network proxies, ended ones included (filled in by TenantAdmin)."""


@dataclass
class _Held:
    """What this process holds for one tenant beyond its stored sessions."""

    creating: list[Resources] = field(default_factory=list)
    calls: int = 0
    calls_started: int = 0
    subscriptions: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


LiveSessions = Callable[[str], Awaitable[list[Session]]]
"""A tenant's live sessions (the store's view, so sessions other control planes hold count too)."""
StoredBytes = Callable[[str], Awaitable[int]]
"""What a tenant's snapshots of every kind hold in the snapshot storage (shared by the planes that share it)."""


class TenantQuotas:
    @classmethod
    def unlimited(cls) -> TenantQuotas:
        """No limits (a control plane built without tenant administration, as in some tests)."""

        async def none(_: str) -> list[Session]:
            return []

        return cls(none)

    def __init__(
        self, live_sessions: LiveSessions, *, defaults: Quota = Quota(),
        configured: Mapping[str, Quota] | None = None, disk_mb_per_session: int = 0,
        refusal_pause_s: float = REFUSAL_PAUSE_S, stored_bytes: StoredBytes | None = None,
    ) -> None:
        self._live_sessions = live_sessions
        self._stored_bytes = stored_bytes
        self.refusals = RefusalGate(pause_s=refusal_pause_s)
        self._defaults = defaults
        self._configured = dict(configured or {})
        self._stored: dict[str, Quota] = {}
        self._disk_mb = disk_mb_per_session
        self._held: dict[str, _Held] = {}
        self.call_share = CallShare()
        """The plane's concurrent calls shared among the tenants calling (controlplane.core.tenants.call_share)."""

    # -- limits -------------------------------------------------------------------------------------

    def set_stored(self, tenant: str, quota: Quota) -> None:
        """The quota set at run time (AdminService.SetQuota), on top of the configured one."""
        self._stored[tenant] = quota

    def forget(self, tenant: str) -> None:
        """A deleted tenant's quota and counters: a new tenant of the same name starts from zero (a slot
        still held by an ending stream is released on the old counters)."""
        self._stored.pop(tenant, None)
        self._held.pop(tenant, None)
        self.refusals.forget(tenant)

    def quota(self, tenant: str) -> Quota:
        layered = self._stored.get(tenant, Quota()).over(self._configured.get(tenant, Quota()).over(self._defaults))
        return layered.effective()

    # -- usage --------------------------------------------------------------------------------------

    def tenants_held(self) -> list[str]:
        return list(self._held)

    def _of(self, tenant: str) -> _Held:
        held = self._held.get(tenant)
        if held is None:
            held = self._held[tenant] = _Held()
        return held

    async def usage(self, tenant: str) -> Usage:
        held = self._of(tenant)
        roots = [s for s in await self._live_sessions(tenant) if not s.parent_id]
        # A PAUSED session runs nothing (its CPU, memory and workspace disk are free); its stored workspace is
        # counted among the stored bytes, as the snapshot it is.
        reserved = [s.resources for s in roots if s.state != SessionState.PAUSED] + held.creating
        stored = await self._stored_bytes(tenant) if self._stored_bytes is not None else 0
        return Usage(
            sessions=len(reserved), cpu=round(sum(r.cpu for r in reserved), 4),
            memory_mb=sum(r.memory_mb for r in reserved),
            disk_mb=self._disk_mb * len(reserved) + math.ceil(stored / MIB),
            calls=held.calls, calls_started=held.calls_started, subscriptions=held.subscriptions,
            stored_bytes=stored,
        )

    def live_disk_mb(self, use: Usage) -> int:
        """The part of `use.disk_mb` that running (and starting) sessions reserve."""
        return self._disk_mb * use.sessions

    async def admit_stored(self, tenant: str, added_bytes: int, *, freed_live: int = 0, freed_bytes: int = 0,
                           what: str = "snapshot") -> None:
        """Called once an act has stored `added_bytes` more of the tenant's workspaces (so they count already),
        before it frees `freed_live` running sessions' workspace disk and `freed_bytes` of stored ones: refused when
        the act leaves the tenant over its disk quota. An act that grows nothing (a pause whose stored workspace is
        smaller than the live one it ends) is never refused: it only lowers the use."""
        limit = self.quota(tenant).disk_mb
        if limit is None or added_bytes <= freed_live * self._disk_mb * MIB + freed_bytes:
            return
        use = await self.usage(tenant)
        live_mb = self.live_disk_mb(use) - freed_live * self._disk_mb
        stored = use.stored_bytes - freed_bytes
        if live_mb * MIB + stored > limit * MIB:
            raise QuotaExceededError(
                f"tenant {tenant}'s disk quota of {limit} MiB would be exceeded: {live_mb} MiB reserved by live "
                f"sessions and {stored / MIB:.1f} MiB of stored workspaces (snapshots, paused sessions, retained "
                f"ones) with this {what} (quota.disk_mb); delete a snapshot or a session")

    def running(self, tenant: str) -> Usage:
        """What this process counts without asking the store (for metrics, observed synchronously)."""
        held = self._of(tenant)
        return Usage(calls=held.calls, calls_started=held.calls_started, subscriptions=held.subscriptions)

    # -- admission ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def creating(self, tenant: str, resources: Resources, request_bytes: int = 0) -> AsyncIterator[None]:
        """Admits one new session reserving `resources`, held as a creation until the block ends
        (by then the session is in the store, or it failed). `request_bytes`: what a refusal would hold."""
        held = self._of(tenant)
        refused: QuotaExceededError | None = None
        async with held.lock:
            quota = self.quota(tenant)
            try:
                if any(getattr(quota, k) is not None for k in ("sessions", "cpu", "memory_mb", "disk_mb")):
                    self._admit_session(tenant, quota, await self.usage(tenant), resources)
            except QuotaExceededError as exc:
                refused = exc
            else:
                held.creating.append(resources)
        if refused is not None:
            await self.pause_refusal(tenant, request_bytes)  # not under the lock: the tenant's other creates go on
            raise refused
        try:
            yield
        finally:
            held.creating.remove(resources)

    def _admit_session(self, tenant: str, quota: Quota, use: Usage, asked: Resources) -> None:
        advice = "delete a session or ask the operator to raise it"
        if quota.sessions is not None and use.sessions + 1 > quota.sessions:
            raise QuotaExceededError(
                f"tenant {tenant}'s quota of {quota.sessions} sessions is used up ({use.sessions} live); {advice}"
            )
        checks: tuple[tuple[str, float | None, float, float, str], ...] = (
            ("cpu", quota.cpu, use.cpu, asked.cpu, "CPUs"),
            ("memory_mb", quota.memory_mb, use.memory_mb, asked.memory_mb, "MiB of memory"),
        )
        for _key, limit, used, more, unit in checks:
            if limit is not None and used + more > limit + 1e-9:
                raise QuotaExceededError(
                    f"tenant {tenant}'s quota of {_num(limit)} {unit} would be exceeded: {_num(used)} reserved by "
                    f"live sessions and {_num(more)} asked; {advice}"
                )
        self._admit_disk(tenant, quota.disk_mb, use, advice)

    def _admit_disk(self, tenant: str, limit: int | None, use: Usage, advice: str) -> None:
        # In bytes: a tenant's stored workspaces are not whole MiB, and rounding each up would refuse early.
        live_mb = self.live_disk_mb(use)
        if limit is None or (live_mb + self._disk_mb) * MIB + use.stored_bytes <= limit * MIB:
            return
        if not use.stored_bytes:
            raise QuotaExceededError(
                f"tenant {tenant}'s quota of {limit} MiB of workspace disk would be exceeded: {live_mb} reserved by "
                f"live sessions and {self._disk_mb} asked; {advice}"
            )
        raise QuotaExceededError(
            f"tenant {tenant}'s quota of {limit} MiB of workspace disk would be exceeded (quota.disk_mb): {live_mb} "
            f"reserved by live sessions, {use.stored_bytes / MIB:.1f} held by stored workspaces (snapshots, paused "
            f"sessions, retained ones) and {self._disk_mb} asked; delete a snapshot or a session, or ask the "
            "operator to raise it"
        )

    async def pause_refusal(self, tenant: str, request_bytes: int = 0) -> None:
        """Returns when the tenant's refusal may be sent: after REFUSAL_PAUSE_S at the least, and at the
        tenant's budget of refusals a second (controlplane.core.tenants.refusals). `request_bytes`: what the
        refused request keeps in memory while it is held (a CreateSession's archive)."""
        await self.refusals.hold(tenant, request_bytes)

    def take_call(self, tenant: str) -> Slot:
        """One running ExecuteTool call or Exec, counted until the slot is released."""
        held = self._of(tenant)
        limit = self.quota(tenant).calls
        if limit is not None and held.calls >= limit:
            raise QuotaExceededError(
                f"tenant {tenant}'s quota of {limit} concurrent calls is used up ({held.calls} running); "
                "wait for a call to end or ask the operator to raise it"
            )
        held.calls += 1
        held.calls_started += 1
        return Slot(held, "calls")

    async def admit_call(self, tenant: str) -> Slot:
        """A call slot (take_call: refused over the quota), once the tenant's fair share of the plane's calls
        lets it run: while other tenants call, a busy tenant's calls beyond its share wait their turn here
        (call_share). A call cancelled while it waits gives its slot back."""
        slot = self.take_call(tenant)
        try:
            slot.then(await self.call_share.turn(tenant, self.quota(tenant).calls))
        except BaseException:
            slot.release()
            raise
        return slot

    def take_subscription(self, tenant: str) -> Slot:
        held = self._of(tenant)
        limit = self.quota(tenant).subscriptions
        if limit is not None and held.subscriptions >= limit:
            raise QuotaExceededError(
                f"tenant {tenant}'s quota of {limit} event subscriptions is used up ({held.subscriptions} open); "
                "close a subscription or ask the operator to raise it"
            )
        held.subscriptions += 1
        return Slot(held, "subscriptions")


class Slot:
    """A held call or subscription; released once (a handler's `finally` may run after an early release)."""

    def __init__(self, held: _Held, counter: str) -> None:
        self._held: _Held | None = held
        self._counter = counter
        self._then: Callable[[], None] | None = None

    def then(self, release: Callable[[], None]) -> None:
        """Also runs `release` when the slot is released (a call's fair turn)."""
        self._then = release

    def release(self) -> None:
        if self._held is not None:
            setattr(self._held, self._counter, getattr(self._held, self._counter) - 1)
            self._held = None
            if self._then is not None:
                self._then()


def _num(value: float) -> str:
    return f"{value:g}"


def with_defaults(resources: Resources | None, defaults: Resources) -> Resources:
    """What a create asks for once the session defaults fill what the request left at 0 (the session
    manager checks the bounds; this is only what the quota counts)."""
    if resources is None:
        return defaults
    return replace(
        defaults, **{k: getattr(resources, k) for k in ("cpu", "memory_mb", "pids") if getattr(resources, k)}
    )
