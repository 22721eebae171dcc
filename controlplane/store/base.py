"""What the control plane needs from its durable store, whichever database holds it, and how one is opened.

The core's own protocols (SessionStore, ApprovalStore, TodoStore, SandboxLedger) are each a slice of
`Store`; SQLite (the embedded default) and PostgreSQL (shared by several control planes) implement it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

from controlplane.core.permissions.asks import ApprovalStore
from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.seam.provider import SandboxLedger, SandboxRecord
from controlplane.core.sessions.capacity import ReservationBook
from controlplane.core.sessions.cpu_usage import CpuStore
from controlplane.core.sessions.models import NetworkPolicy, Resources, Session, SessionState, Tenant
from controlplane.core.sessions.services import TodoStore
from controlplane.core.sessions.store_port import SessionStore
from controlplane.core.tenants.quota import Quota
from controlplane.core.tenants.records import Origin, TenantRecord
from controlplane.egress_proxy.accounting import EgressStore
from controlplane.errors import ConfigError

SQLITE_FILE = "controlplane.db"
SQLITE_SCHEME = "sqlite://"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
AUDIT_FLUSH_S = 0.05
AUDIT_BATCH = 512


class Row(Protocol):
    """A result row read by column name (sqlite3.Row, psycopg's dict rows)."""

    def __getitem__(self, key: str) -> Any: ...


SESSION_COLUMNS = (
    "id", "tenant", "agent", "state", "sandbox_id", "labels", "resources", "config_json", "status_message",
    "created_at", "last_active_at", "deleted_at", "parent_id", "title", "caller_config_json", "template",
    "network_json",
)


def session_upsert(placeholder: str) -> str:
    """A session written whole, in both stores' SQL (`placeholder`: `?` or `%s`). Written whole, a session is no
    longer claimed for a resume. A DELETED row is never written over: several planes share the store, and a
    plane finishing a pause (or any end) of a session another plane deleted meanwhile must not bring it back."""
    updates = ", ".join(f"{c} = excluded.{c}" for c in SESSION_COLUMNS[1:]) + ", resume_holder = ''"
    values = ", ".join([placeholder] * len(SESSION_COLUMNS))
    return (f"INSERT INTO sessions ({', '.join(SESSION_COLUMNS)}) VALUES ({values})"
            f" ON CONFLICT (id) DO UPDATE SET {updates} WHERE sessions.state <> 'DELETED'")


def session_values(s: Session) -> tuple[Any, ...]:
    return (
        s.id, s.tenant, s.agent, s.state.value, s.sandbox_id, json.dumps(s.labels),
        json.dumps(s.resources.__dict__), s.config_json, s.status_message, s.created_at,
        s.last_active_at, s.deleted_at, s.parent_id, s.title, s.caller_config_json, s.template,
        s.network.to_json() if s.network is not None else None,
    )


def session_of(row: Row) -> Session:
    """A `sessions` row as the domain's Session (both stores share the schema)."""
    return Session(
        id=row["id"],
        tenant=row["tenant"],
        agent=row["agent"],
        state=SessionState(row["state"]),
        resources=Resources(**json.loads(row["resources"])),
        created_at=row["created_at"],
        last_active_at=row["last_active_at"],
        sandbox_id=row["sandbox_id"],
        labels=json.loads(row["labels"]),
        config_json=row["config_json"],
        status_message=row["status_message"],
        deleted_at=row["deleted_at"],
        parent_id=row["parent_id"],
        title=row["title"],
        caller_config_json=row["caller_config_json"],
        template=row["template"],
        network=NetworkPolicy.from_json(row["network_json"]),
    )


def audit_entry_of(row: Row) -> AuditEntry:
    return AuditEntry(
        tenant=row["tenant"], session_id=row["session_id"], kind=row["kind"], tool=row["tool"],
        call_id=row["call_id"], outcome=row["outcome"], permission=row["permission"],
        patterns=tuple(json.loads(row["patterns"])), rule=row["rule"], detail=row["detail"], time=row["time"],
    )


def sandbox_of(row: Row) -> SandboxRecord:
    return SandboxRecord(row["id"], row["instance"], row["state"], row["session_id"], row["created_at"])


def tenant_of(row: Row) -> TenantRecord:
    return TenantRecord(
        name=row["name"], token_sha256=row["token_sha256"], created_at=row["created_at"], origin=row["origin"],
        expires_at=row["expires_at"], revoked_at=row["revoked_at"],
        quota=Quota.from_dict(json.loads(row["quota_json"])), deleting_at=row["deleting_at"],
    )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AuditSink(Protocol):
    async def add_audit(self, entries: list[AuditEntry]) -> None: ...


class Store(AuditSink, SessionStore, ApprovalStore, TodoStore, SandboxLedger, CpuStore, EgressStore, ReservationBook,
            Protocol):
    """Tenants, sessions, sandbox records, "always" approvals, todos and the audit record: the core's ports
    (each declared once, by the core that uses it) and what only the composition root and the API need."""

    async def aclose(self) -> None: ...

    async def put_tenant(
        self, name: str, token_sha256: str, *, origin: Origin = "config", expires_at: float | None = None,
    ) -> None:
        """Upserts by name: a new token, origin and expiry; lifts a revocation."""
        ...

    async def tenant_tokens(self) -> dict[str, Tenant]:
        """sha256(token) -> tenant, revoked ones left out."""
        ...

    async def tenant_records(self) -> list[TenantRecord]: ...

    async def revoke_tenant(self, name: str, at: float) -> None: ...

    async def delete_tenant(self, name: str) -> None: ...

    async def mark_tenant_deleting(self, name: str, at: float) -> None:
        """Revokes the tenant (if it was not) and marks its delete begun."""
        ...

    async def purge_tenant(self, name: str) -> None:
        """Removes every session record of tenant `name` with its approvals and todos; the audit stays (the
        operator's record). Called before a tenant of that name is made again, so it starts with nothing."""
        ...

    async def set_tenant_quota(self, name: str, quota: Quota) -> None: ...

    async def admin_token_sha256(self) -> str | None: ...

    async def put_admin_token(self, token_sha256: str) -> None: ...

    async def audit_entries(self, tenant: str, session_id: str = "") -> list[AuditEntry]: ...


def check_url(url: str) -> str:
    """`url` if it names a store this build can open (the empty string: SQLite in the data dir)."""
    if url == "" or url.startswith(POSTGRES_SCHEMES):
        return url
    if url.startswith(SQLITE_SCHEME):
        if not url[len(SQLITE_SCHEME):].startswith("/"):
            raise ConfigError(f"store.url {url!r}: write an absolute SQLite path as sqlite:///path/to/file.db")
        return url
    raise ConfigError(f"store.url must start with sqlite:// or postgresql://, got {url.split('://')[0]!r}")


def describe(url: str) -> str:
    """The URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"


async def open_store(url: str, data_dir: Path, pool_size: int = 10) -> Store:
    """The store `url` names, migrated to the latest schema; "" is the SQLite file in `data_dir`."""
    check_url(url)
    if url.startswith(POSTGRES_SCHEMES):
        # Imported here so that a SQLite-only installation does not need psycopg.
        from controlplane.store.postgres import PostgresStore

        return await PostgresStore.open(url, pool_size)
    from controlplane.store.sqlite import SqliteStore

    path = Path(url[len(SQLITE_SCHEME):]) if url else data_dir / SQLITE_FILE
    return await asyncio.to_thread(SqliteStore, path)


class AuditWriter:
    """The audit log: entries are queued and written in batches every AUDIT_FLUSH_S."""

    def __init__(self, store: AuditSink) -> None:
        self._store = store
        self._queue: list[AuditEntry] = []
        self._flusher: asyncio.Task[None] | None = None

    async def record(self, entry: AuditEntry) -> None:
        self._queue.append(entry)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(AUDIT_FLUSH_S)
        await self.flush()

    async def flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:AUDIT_BATCH], self._queue[AUDIT_BATCH:]
            await self._store.add_audit(batch)

    async def close(self) -> None:
        if self._flusher is not None:
            await self._flusher
        await self.flush()
