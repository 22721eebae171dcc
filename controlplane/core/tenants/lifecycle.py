"""The operator's tenant lifecycle: create, list, quota, rotate, revoke, delete, and the reconciliation
of the tenants declared in the operator's TOML.

Every change is written to the store first and then replaces the in-memory token directory and quotas,
so it holds from the next RPC on this control plane; control planes sharing the store pick it up on
their next refresh (every REFRESH_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from controlplane.core.sessions.models import Session, SessionState
from controlplane.core.tenants.quota import Quota, TenantQuotas, Usage
from controlplane.core.tenants.records import Origin, TenantRecord, TokenDirectory, hash_token, new_token
from controlplane.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError

log = logging.getLogger(__name__)
REFRESH_S = 2.0
"""How often records are read again, for changes made by another control plane on the same store."""
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class TenantStore(Protocol):
    async def tenant_records(self) -> list[TenantRecord]: ...

    async def put_tenant(
        self, name: str, token_sha256: str, *, origin: Origin = "config", expires_at: float | None = None,
    ) -> None: ...

    async def revoke_tenant(self, name: str, at: float) -> None: ...

    async def delete_tenant(self, name: str) -> None: ...

    async def mark_tenant_deleting(self, name: str, at: float) -> None: ...

    async def purge_tenant(self, name: str) -> None: ...

    async def set_tenant_quota(self, name: str, quota: Quota) -> None: ...

    async def admin_token_sha256(self) -> str | None: ...

    async def put_admin_token(self, token_sha256: str) -> None: ...


class TenantSessions(Protocol):
    """The session manager's normal paths, so a deleted tenant's sandboxes go the way any session's do."""

    async def list_sessions(self, tenant: str, include_deleted: bool = False) -> list[Session]: ...

    async def delete(self, tenant: str, session_id: str) -> Session: ...

    async def cpu_seconds(self, tenant: str) -> float: ...


class TenantEgress(Protocol):
    async def tenant_bytes(self, tenant: str) -> int: ...


@dataclass(frozen=True)
class Declared:
    """A tenant as the operator's TOML declares it."""

    name: str
    token_sha256: str


class TenantAdmin:
    def __init__(
        self, store: TenantStore, directory: TokenDirectory, quotas: TenantQuotas,
        sessions: TenantSessions | None = None, clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self.directory = directory
        self.quotas = quotas
        self.sessions = sessions
        self.egress: TenantEgress | None = None
        """Network bytes per tenant (controlplane/egress_proxy/accounting.py), set by the composition root."""
        self._clock = clock
        self._refresher: asyncio.Task[None] | None = None
        self._declared: dict[str, Declared] = {}
        self.usage_seen: dict[str, Usage] = {}
        """Every tenant's usage at the last refresh round (what the metrics report)."""

    # -- start ----------------------------------------------------------------------------------------

    async def reconcile(self, declared: Iterable[Declared]) -> list[str]:
        """Upserts the declared tenants and revokes every earlier declared one the TOML no longer names, and
        the generated `default` one once it names any. Tenants made through the API are the operator's."""
        declared = list(declared)
        self._declared = {d.name: d for d in declared}
        names = {d.name for d in declared}
        for d in declared:
            await self._store.put_tenant(d.name, d.token_sha256, origin="config")
        revoked = []
        now = self._clock()
        for record in await self._store.tenant_records():
            if record.origin != "api" and record.name not in names and record.revoked_at is None:
                # A tenant from before origins were recorded is "config"; the generated default is made
                # because the TOML declares no tenant, so it stays usable exactly while that holds.
                if record.name == "default" and not names:
                    continue
                await self._store.revoke_tenant(record.name, now)
                revoked.append(record.name)
        if revoked:
            log.warning("revoked tenants no longer in the configuration: %s", ", ".join(sorted(revoked)))
        return revoked

    async def ensure_admin_token(self, have_file: bool) -> str | None:
        """A new admin token when none is stored or its file is gone (returned to be written), else None."""
        if have_file and await self._store.admin_token_sha256():
            return None
        token = new_token()
        await self._store.put_admin_token(hash_token(token))
        return token

    async def refresh(self) -> None:
        records = await self._store.tenant_records()
        self.directory.replace(records)
        self.directory.set_admin(await self._store.admin_token_sha256() or "")
        for record in records:
            self.quotas.set_stored(record.name, record.quota)

    async def measure(self) -> None:
        self.usage_seen = {r.name: await self._usage(r.name) for r in await self._store.tenant_records()}

    async def _usage(self, name: str) -> Usage:
        usage = await self.quotas.usage(name)
        if self.sessions is not None:
            usage.cpu_seconds = await self.sessions.cpu_seconds(name)
        if self.egress is not None:
            usage.egress_bytes = await self.egress.tenant_bytes(name)
        return usage

    def start_refreshing(self, interval_s: float = REFRESH_S) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await self.refresh()
                    await self.measure()
                except Exception:  # a store hiccup keeps the last view; the next round tries again
                    log.warning("could not refresh tenants from the store", exc_info=True)

        self._refresher = asyncio.get_running_loop().create_task(loop())

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher

    # -- operations -----------------------------------------------------------------------------------

    async def list_tenants(self) -> list[TenantRecord]:
        return sorted(await self._store.tenant_records(), key=lambda r: r.name)

    async def get(self, name: str) -> TenantRecord:
        for record in await self._store.tenant_records():
            if record.name == name:
                return record
        raise NotFoundError(f"tenant {name!r} not found")

    def _expiry(self, ttl_s: float) -> float | None:
        if ttl_s < 0:
            raise InvalidArgumentError(f"ttl_s must be >= 0, got {ttl_s}")
        return self._clock() + ttl_s if ttl_s else None

    async def create(self, name: str, ttl_s: float = 0, quota: Quota | None = None) -> tuple[TenantRecord, str]:
        if not NAME.match(name):
            raise InvalidArgumentError(f"tenant name {name!r} must match {NAME.pattern}")
        if any(r.name == name for r in await self._store.tenant_records()):
            raise FailedPreconditionError(f"tenant {name!r} exists; rotate its token or delete it first")
        token = new_token()
        await self._store.purge_tenant(name)  # what a deleted tenant of this name left is not the new one's
        await self._store.put_tenant(name, hash_token(token), origin="api", expires_at=self._expiry(ttl_s))
        if quota is not None and quota != Quota():
            await self._store.set_tenant_quota(name, quota)
        await self.refresh()
        return await self.get(name), token

    async def usage(self, name: str) -> Usage:
        await self.get(name)
        return await self._usage(name)

    async def set_quota(self, name: str, quota: Quota) -> TenantRecord:
        await self.get(name)
        await self._store.set_tenant_quota(name, quota)
        await self.refresh()
        return await self.get(name)

    async def rotate(self, name: str, ttl_s: float = 0) -> tuple[TenantRecord, str]:
        """A new token; the old one is unknown from now on. Lifts a revocation."""
        record = await self.get(name)
        token = new_token()
        await self._store.put_tenant(name, hash_token(token), origin=record.origin, expires_at=self._expiry(ttl_s))
        await self.refresh()
        return await self.get(name), token

    async def revoke(self, name: str) -> TenantRecord:
        await self.get(name)
        await self._store.revoke_tenant(name, self._clock())
        await self.refresh()
        return await self.get(name)

    async def delete(self, name: str) -> tuple[TenantRecord, list[str]]:
        """Revoked and marked first, so no new session appears while its sessions are deleted, and a restart
        in the middle finishes the delete (finish_deletes). The session records stay until a tenant of the
        same name is made again (create purges them), so the operator can still read what the tenant had."""
        await self.get(name)
        await self._store.mark_tenant_deleting(name, self._clock())
        await self.refresh()
        record = await self.get(name)
        deleted = await self._delete_sessions(name)
        await self._store.delete_tenant(name)
        await self.refresh()
        self.quotas.forget(name)
        return replace(record), deleted

    async def _delete_sessions(self, name: str) -> list[str]:
        deleted: list[str] = []
        if self.sessions is not None:
            for session in await self.sessions.list_sessions(name):
                if session.state != SessionState.DELETED:
                    await self.sessions.delete(name, session.id)
                    deleted.append(session.id)
        return deleted

    async def finish_deletes(self) -> list[str]:
        """At start, once sessions can be deleted: finishes every delete a stop interrupted. A tenant the TOML
        still declares is then made again from nothing, as at a first start."""
        finished = []
        for record in await self._store.tenant_records():
            if record.deleting_at is None:
                continue
            await self._delete_sessions(record.name)
            await self._store.delete_tenant(record.name)
            self.quotas.forget(record.name)
            declared = self._declared.get(record.name)
            if declared is not None:
                await self._store.purge_tenant(record.name)
                await self._store.put_tenant(record.name, declared.token_sha256, origin="config")
            finished.append(record.name)
        if finished:
            log.warning("finished deleting tenants: %s", ", ".join(sorted(finished)))
            await self.refresh()
        return finished
