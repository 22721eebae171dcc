"""The store on PostgreSQL (psycopg 3, async, pooled): the SQLite store's schema and behaviour, for several
control planes sharing one database.

Columns and their JSON text are the same as SQLite's (store/migrations.py), so rows read back identically.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.permissions.permission import Rule
from controlplane.core.seam.provider import SandboxRecord
from controlplane.core.sessions.capacity import Claim, HostUse
from controlplane.core.sessions.models import Session, Tenant
from controlplane.core.tenants.quota import Quota
from controlplane.core.tenants.records import Origin, TenantRecord
from controlplane.errors import ControlPlaneError, ErrorCode
from controlplane.store import host_book, resume_claims
from controlplane.store.base import (
    audit_entry_of,
    describe,
    sandbox_of,
    session_of,
    session_upsert,
    session_values,
    tenant_of,
)
from controlplane.store.migrations import MIGRATIONS, VERSION_TABLE, Migration

Connection = psycopg.AsyncConnection[DictRow]
MIGRATION_LOCK = 0x6F63_7362_5F64_6201
"""pg_advisory lock key held while migrating, so control planes starting together apply each step once."""
CONNECT_TIMEOUT_S = 10.0

AUDIT_COLUMNS = (
    "time", "tenant", "session_id", "kind", "tool", "call_id", "outcome", "permission", "patterns", "rule", "detail",
)


class StoreUnavailableError(ControlPlaneError):
    code = ErrorCode.UNAVAILABLE


class PostgresStore:
    """Every call takes a pooled connection in autocommit mode: each statement is its own transaction,
    as in the SQLite store, and another control plane sees it as soon as it returns."""

    def __init__(self, pool: AsyncConnectionPool[Connection], url: str) -> None:
        self._pool = pool
        self.url = url

    @classmethod
    async def open(cls, url: str, pool_size: int = 10, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> PostgresStore:
        # Connections are checked when handed out, so a restarted server or a dropped connection costs
        # one reconnect instead of a failed call.
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            url, min_size=1, max_size=max(1, pool_size), open=False, name="ocsb-store",
            kwargs={"autocommit": True, "row_factory": dict_row}, timeout=connect_timeout_s,
            check=AsyncConnectionPool.check_connection,
        )
        try:
            await pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            await pool.close()
            raise StoreUnavailableError(
                f"PostgreSQL at {describe(url)} did not accept a connection within {connect_timeout_s:g} s"
            ) from exc
        store = cls(pool, url)
        try:
            await store._migrate()
        except BaseException:
            await pool.close()
            raise
        return store

    async def aclose(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise StoreUnavailableError(f"the PostgreSQL store is unavailable: {exc}") from exc

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        async with self._connection() as conn:
            await conn.execute(sql, params)

    async def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        async with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.executemany(sql, rows)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[DictRow]:
        async with self._connection() as conn:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall()

    # -- schema ---------------------------------------------------------------------------------

    async def _migrate(self) -> None:
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute(VERSION_TABLE.format(real="DOUBLE PRECISION"))
            cursor = await conn.execute("SELECT version FROM schema_migrations")
            applied = {row["version"] for row in await cursor.fetchall()}
            for migration in MIGRATIONS:
                if migration.version not in applied:
                    await _apply(conn, migration)

    async def schema_version(self) -> int:
        rows = await self._fetch("SELECT coalesce(max(version), 0) AS v FROM schema_migrations")
        return int(rows[0]["v"])

    # -- tenants --------------------------------------------------------------------------------

    async def put_tenant(
        self, name: str, token_sha256: str, *, origin: Origin = "config", expires_at: float | None = None,
    ) -> None:
        await self._execute(
            "INSERT INTO tenants (name, token_sha256, created_at, origin, expires_at) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET token_sha256 = excluded.token_sha256, origin = excluded.origin, "
            "expires_at = excluded.expires_at, revoked_at = NULL",
            (name, token_sha256, time.time(), origin, expires_at),
        )

    async def tenant_tokens(self) -> dict[str, Tenant]:
        return {r.token_sha256: Tenant(r.name) for r in await self.tenant_records() if r.revoked_at is None}

    async def tenant_records(self) -> list[TenantRecord]:
        return [tenant_of(row) for row in await self._fetch("SELECT * FROM tenants ORDER BY name")]

    async def revoke_tenant(self, name: str, at: float) -> None:
        await self._execute("UPDATE tenants SET revoked_at = %s WHERE name = %s AND revoked_at IS NULL", (at, name))

    async def delete_tenant(self, name: str) -> None:
        await self._execute("DELETE FROM tenants WHERE name = %s", (name,))
        await self._execute("DELETE FROM sandbox_cpu WHERE tenant = %s", (name,))
        await self._execute("DELETE FROM session_egress WHERE tenant = %s", (name,))

    async def put_sandbox_cpu(self, sandbox_id: str, tenant: str, cpu_seconds: float) -> None:
        await self._execute(
            "INSERT INTO sandbox_cpu (sandbox_id, tenant, cpu_seconds) VALUES (%s, %s, %s) ON CONFLICT (sandbox_id) "
            "DO UPDATE SET cpu_seconds = greatest(sandbox_cpu.cpu_seconds, excluded.cpu_seconds)",
            (sandbox_id, tenant, cpu_seconds),
        )

    async def tenant_cpu_seconds(self, tenant: str) -> float:
        rows = await self._fetch(
            "SELECT coalesce(sum(cpu_seconds), 0) AS s FROM sandbox_cpu WHERE tenant = %s", (tenant,)
        )
        return float(rows[0]["s"])

    async def add_session_egress(self, session_id: str, tenant: str, added_bytes: int) -> None:
        await self._execute(
            "INSERT INTO session_egress (session_id, tenant, total_bytes) VALUES (%s, %s, %s) "
            "ON CONFLICT (session_id) DO UPDATE SET total_bytes = session_egress.total_bytes + excluded.total_bytes",
            (session_id, tenant, added_bytes),
        )

    async def session_egress_bytes(self, session_id: str) -> int:
        rows = await self._fetch("SELECT total_bytes FROM session_egress WHERE session_id = %s", (session_id,))
        return int(rows[0]["total_bytes"]) if rows else 0

    async def tenant_egress_bytes(self, tenant: str) -> int:
        rows = await self._fetch(
            "SELECT coalesce(sum(total_bytes), 0) AS s FROM session_egress WHERE tenant = %s", (tenant,)
        )
        return int(rows[0]["s"])

    async def mark_tenant_deleting(self, name: str, at: float) -> None:
        await self._execute(
            "UPDATE tenants SET deleting_at = %s, revoked_at = COALESCE(revoked_at, %s) WHERE name = %s",
            (at, at, name),
        )

    async def purge_tenant(self, name: str) -> None:
        owned = "SELECT id FROM sessions WHERE tenant = %s"
        # One statement each, children first: a crash between them leaves sessions whose leftovers a retry
        # (the next create of the name) removes, never leftovers without their session.
        await self._execute(f"DELETE FROM approvals WHERE session_id IN ({owned})", (name,))
        await self._execute(f"DELETE FROM todos WHERE session_id IN ({owned})", (name,))
        await self._execute("DELETE FROM sessions WHERE tenant = %s", (name,))
        # A sandbox removed after the delete began records its CPU late: the new tenant must not inherit it.
        await self._execute("DELETE FROM sandbox_cpu WHERE tenant = %s", (name,))
        await self._execute("DELETE FROM session_egress WHERE tenant = %s", (name,))

    async def set_tenant_quota(self, name: str, quota: Quota) -> None:
        await self._execute("UPDATE tenants SET quota_json = %s WHERE name = %s", (json.dumps(quota.to_dict()), name))

    async def admin_token_sha256(self) -> str | None:
        rows = await self._fetch("SELECT token_sha256 FROM admin_tokens WHERE name = 'admin'")
        return str(rows[0]["token_sha256"]) if rows else None

    async def put_admin_token(self, token_sha256: str) -> None:
        await self._execute(
            "INSERT INTO admin_tokens (name, token_sha256, created_at) VALUES ('admin', %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET token_sha256 = excluded.token_sha256, created_at = excluded.created_at",
            (token_sha256, time.time()),
        )

    # -- sessions -------------------------------------------------------------------------------

    async def put_session(self, s: Session) -> None:
        await self._execute(session_upsert("%s"), session_values(s))

    async def touch_session(self, session_id: str, at: float) -> None:
        await self._execute("UPDATE sessions SET last_active_at = %s WHERE id = %s", (at, session_id))

    async def claim_paused(self, session_id: str, holder: str, at: float, stale_before: float) -> str:
        async with self._connection() as conn:
            await conn.execute(_claims(resume_claims.CLAIM), (holder, at, session_id, holder, stale_before))
            row = await (await conn.execute(_claims(resume_claims.HOLDER), (session_id,))).fetchone()
        return str(row["resume_holder"]) if row is not None and row["state"] == "PAUSED" else ""

    async def put_resumed(self, s: Session, holder: str) -> bool:
        async with self._connection() as conn:
            cursor = await conn.execute(_claims(resume_claims.RESUMED), (s.sandbox_id, s.last_active_at, s.id, holder))
            return cursor.rowcount > 0

    async def release_claim(self, session_id: str, holder: str) -> None:
        await self._execute(_claims(resume_claims.RELEASE), (session_id, holder))

    async def get_session(self, session_id: str) -> Session | None:
        rows = await self._fetch("SELECT * FROM sessions WHERE id = %s", (session_id,))
        return session_of(rows[0]) if rows else None

    async def list_sessions(self, tenant: str | None = None, live_only: bool = False,
                            with_paused: bool = False) -> list[Session]:
        sql, params = "SELECT * FROM sessions WHERE true", []
        if tenant is not None:
            sql += " AND tenant = %s"
            params.append(tenant)
        if live_only:
            sql += " AND state IN ('CREATING', 'READY', 'PAUSED')" if with_paused else \
                " AND state IN ('CREATING', 'READY')"
        rows = await self._fetch(sql + " ORDER BY created_at, id", params)
        return [session_of(row) for row in rows]

    # -- approvals, todos ----------------------------------------------------------------------

    async def load_approvals(self, session_id: str) -> list[Rule]:
        rows = await self._fetch(
            "SELECT permission, pattern FROM approvals WHERE session_id = %s ORDER BY seq", (session_id,)
        )
        return [Rule(r["permission"], r["pattern"], "allow") for r in rows]

    async def add_approvals(self, session_id: str, rules: list[Rule]) -> None:
        now = time.time()
        await self._execute_many(
            "INSERT INTO approvals (session_id, permission, pattern, created_at) VALUES (%s, %s, %s, %s)",
            [(session_id, r.permission, r.pattern, now) for r in rules],
        )

    async def get_todos(self, session_id: str) -> list[dict[str, Any]]:
        rows = await self._fetch("SELECT todos_json FROM todos WHERE session_id = %s", (session_id,))
        todos: list[dict[str, Any]] = json.loads(rows[0]["todos_json"]) if rows else []
        return todos

    async def put_todos(self, session_id: str, todos: list[dict[str, Any]]) -> None:
        # A multi-MiB list (todowrite's arguments may be) is encoded off the loop every tenant shares.
        text = await asyncio.to_thread(json.dumps, todos, ensure_ascii=False) if len(todos) > 256 else json.dumps(
            todos, ensure_ascii=False)
        await self._execute(
            "INSERT INTO todos (session_id, todos_json, updated_at) VALUES (%s, %s, %s) ON CONFLICT (session_id)"
            " DO UPDATE SET todos_json = excluded.todos_json, updated_at = excluded.updated_at",
            (session_id, text, time.time()),
        )

    # -- audit ----------------------------------------------------------------------------------

    async def add_audit(self, entries: list[AuditEntry]) -> None:
        await self._execute_many(
            f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join(['%s'] * len(AUDIT_COLUMNS))})",
            [(e.time, e.tenant, e.session_id, e.kind, e.tool, e.call_id, e.outcome, e.permission,
              json.dumps(list(e.patterns), ensure_ascii=False), e.rule, e.detail) for e in entries],
        )

    async def audit_entries(self, tenant: str, session_id: str = "") -> list[AuditEntry]:
        sql, params = "SELECT * FROM audit WHERE tenant = %s", [tenant]
        if session_id:
            sql += " AND session_id = %s"
            params.append(session_id)
        rows = await self._fetch(sql + " ORDER BY seq", params)
        return [audit_entry_of(r) for r in rows]

    # -- sandboxes (SandboxLedger) --------------------------------------------------------------

    async def put_sandbox(self, record: SandboxRecord) -> None:
        await self._execute(
            "INSERT INTO sandboxes (id, instance, state, session_id, created_at) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, state = excluded.state,"
            " session_id = excluded.session_id, created_at = excluded.created_at",
            (record.id, record.instance, record.state, record.session_id, record.created_at),
        )

    async def claim_sandbox(self, sandbox_id: str, session_id: str) -> None:
        await self._execute(
            "UPDATE sandboxes SET state = 'claimed', session_id = %s WHERE id = %s", (session_id, sandbox_id)
        )

    async def forget_sandbox(self, sandbox_id: str) -> None:
        await self._execute("DELETE FROM sandboxes WHERE id = %s", (sandbox_id,))

    async def list_sandboxes(self, instance: str) -> list[SandboxRecord]:
        rows = await self._fetch("SELECT * FROM sandboxes WHERE instance = %s ORDER BY created_at, id", (instance,))
        return [sandbox_of(r) for r in rows]


    # -- host reservations (core/sessions/capacity.ReservationBook) -------------------------------

    @asynccontextmanager
    async def _host_locked(self, host: str) -> AsyncIterator[Connection]:
        """A transaction holding the host's advisory lock: planes taking on one host go one at a time."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (host_book.HOST_LOCK_PREFIX + host,))
            yield conn

    async def take_host_reservation(self, claim: Claim, now: float, lease_s: float,
                                    check: Callable[[HostUse], None]) -> None:
        async with self._host_locked(claim.host) as conn:
            for statement, params in host_book.forget_expired(claim.host, now):
                await conn.execute(_pg(statement), params)
            cursor = await conn.execute(_pg(host_book.SUM), (claim.host,))
            row = await cursor.fetchone()
            check(host_book.use_of(row))
            await conn.execute(_pg(host_book.INSERT), host_book.insert_params(claim, now))

    async def put_host_reservations(self, host: str, plane: str, claims: list[Claim], now: float,
                                    lease_s: float) -> None:
        async with self._host_locked(host) as conn:
            await conn.execute(_pg(host_book.DROP_PLANE), (host, plane))
            async with conn.cursor() as cur:
                await cur.executemany(_pg(host_book.INSERT), [host_book.insert_params(c, now) for c in claims])
            await conn.execute(_pg(host_book.PUT_LEASE), (host, plane, now + lease_s))

    async def keep_host_reservation(self, holder: str, claim: Claim) -> None:
        async with self._host_locked(claim.host) as conn:
            await conn.execute(_pg(host_book.DROP), (holder,))
            await conn.execute(_pg(host_book.INSERT), host_book.insert_params(claim, time.time()))

    async def drop_host_reservation(self, holder: str) -> None:
        await self._execute(_pg(host_book.DROP), (holder,))

    async def host_use(self, host: str, now: float) -> HostUse:
        rows = await self._fetch(_pg(host_book.LIVE_SUM), (host, host, now))
        return host_book.use_of(rows[0])

    async def renew_host_lease(self, host: str, plane: str, now: float, lease_s: float) -> bool:
        async with self._host_locked(host) as conn:
            cursor = await conn.execute(_pg(host_book.RENEW), (now + lease_s, host, plane, now))
            if cursor.rowcount > 0:
                return True
            await conn.execute(_pg(host_book.PUT_LEASE), (host, plane, now + lease_s))
            return False


def _claims(statement: str) -> str:
    return resume_claims.sql(statement, "postgres")


def _pg(statement: str) -> str:
    return host_book.sql(statement, "postgres")


async def _apply(conn: Connection, migration: Migration) -> None:
    for statement in migration.sql("postgres"):
        await conn.execute(statement)
    for table, name, declaration in migration.added_columns:
        await conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {declaration}")
    await conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
        (migration.version, migration.name, time.time()),
    )

