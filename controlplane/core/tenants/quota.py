"""Per-tenant quotas and the accounting they are checked against; no transport, no store.

A quota bounds what one tenant may hold at once: live sessions and what they reserve (CPU, memory,
workspace disk), concurrent calls (ExecuteTool streams and Execs) and concurrent event subscriptions.
Sessions are counted from what the session manager's store says is live, plus creations under way,
so two concurrent creates cannot both take the last slot; calls and subscriptions exist only in
this process, so they are counted here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.errors import ResourceExhaustedError

UNLIMITED = -1
"""A quota value that lifts a limit set below it (the global default or the tenant's TOML entry)."""
KEYS = ("sessions", "cpu", "memory_mb", "disk_mb", "calls", "subscriptions")
REFUSAL_PAUSE_S = 0.1
"""How long a refused create or call waits before its refusal is sent. A client retrying at once in a loop
(a bug or a flood) made 1,000 to 2,000 refused creates a second, a core of the control plane every tenant
shares (the fairness bench); paused, each of its loops makes ten."""
MAX_PAUSED = 8
"""Refusals of one tenant held at once; past it they are sent at once, so pausing never holds more than this
many requests (a CreateSession may carry a large archive)."""


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
    calls: int = 0
    calls_started: int = 0
    subscriptions: int = 0
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
    paused: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


LiveSessions = Callable[[str], Awaitable[list[Session]]]
"""A tenant's live sessions (the store's view, so sessions other control planes hold count too)."""


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
        refusal_pause_s: float = REFUSAL_PAUSE_S,
    ) -> None:
        self._live_sessions = live_sessions
        self._refusal_pause_s = refusal_pause_s
        self._defaults = defaults
        self._configured = dict(configured or {})
        self._stored: dict[str, Quota] = {}
        self._disk_mb = disk_mb_per_session
        self._held: dict[str, _Held] = {}

    # -- limits -------------------------------------------------------------------------------------

    def set_stored(self, tenant: str, quota: Quota) -> None:
        """The quota set at run time (AdminService.SetQuota), on top of the configured one."""
        self._stored[tenant] = quota

    def forget(self, tenant: str) -> None:
        """A deleted tenant's quota and counters: a new tenant of the same name starts from zero (a slot
        still held by an ending stream is released on the old counters)."""
        self._stored.pop(tenant, None)
        self._held.pop(tenant, None)

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
        # A PAUSED session runs nothing (its CPU and memory are free), but its stored workspace keeps its disk.
        reserved = [s.resources for s in roots if s.state != SessionState.PAUSED] + held.creating
        return Usage(
            sessions=len(reserved), cpu=round(sum(r.cpu for r in reserved), 4),
            memory_mb=sum(r.memory_mb for r in reserved),
            disk_mb=self._disk_mb * (len(roots) + len(held.creating)),
            calls=held.calls, calls_started=held.calls_started, subscriptions=held.subscriptions,
        )

    def running(self, tenant: str) -> Usage:
        """What this process counts without asking the store (for metrics, observed synchronously)."""
        held = self._of(tenant)
        return Usage(calls=held.calls, calls_started=held.calls_started, subscriptions=held.subscriptions)

    # -- admission ----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def creating(self, tenant: str, resources: Resources) -> AsyncIterator[None]:
        """Admits one new session reserving `resources`, held as a creation until the block ends
        (by then the session is in the store, or it failed)."""
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
            await self.pause_refusal(tenant)  # not under the lock: the tenant's other creates go on
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
            ("disk_mb", quota.disk_mb, use.disk_mb, self._disk_mb, "MiB of workspace disk"),
        )
        for _key, limit, used, more, unit in checks:
            if limit is not None and used + more > limit + 1e-9:
                raise QuotaExceededError(
                    f"tenant {tenant}'s quota of {_num(limit)} {unit} would be exceeded: {_num(used)} reserved by "
                    f"live sessions and {_num(more)} asked; {advice}"
                )

    async def pause_refusal(self, tenant: str) -> None:
        """Holds a refusal for REFUSAL_PAUSE_S, unless MAX_PAUSED of the tenant's are held already."""
        held = self._of(tenant)
        if held.paused >= MAX_PAUSED or self._refusal_pause_s <= 0:
            return
        held.paused += 1
        try:
            await asyncio.sleep(self._refusal_pause_s)
        finally:
            held.paused -= 1

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

    def release(self) -> None:
        if self._held is not None:
            setattr(self._held, self._counter, getattr(self._held, self._counter) - 1)
            self._held = None


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
