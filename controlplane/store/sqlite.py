"""The embedded store: tenants, sessions, sandbox records, "always" approvals, todos and the audit
record, in one SQLite file (WAL mode).

Calls run in a worker thread so the event loop never blocks on the disk. Audit entries are written
in small batches (see AuditWriter) so auditing stays off a tool call's critical path.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.permissions.permission import Rule
from controlplane.core.seam.provider import SandboxRecord
from controlplane.core.sessions.capacity import Claim, HostUse
from controlplane.core.sessions.models import Session, Tenant
from controlplane.core.tenants.quota import Quota
from controlplane.core.tenants.records import Origin, TenantRecord
from controlplane.store import host_book, resume_claims
from controlplane.store.base import (
    AuditWriter,
    audit_entry_of,
    hash_token,
    sandbox_of,
    session_of,
    session_upsert,
    session_values,
    tenant_of,
)
from controlplane.store.migrations import LATEST, MIGRATIONS, VERSION_TABLE, Migration

T = TypeVar("T")

__all__ = ["AuditWriter", "SqliteStore", "hash_token"]


WAL_SWITCH_TIMEOUT_S = 5.0


class SqliteStore:
    """Implements the SandboxLedger too, so sandbox claims commit with session state."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA busy_timeout=5000")
        self._enter_wal()
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def _enter_wal(self) -> None:
        # Switching a new file to WAL needs it alone, and SQLite answers "locked" at once (no busy
        # wait) when another process opens the same new file at that moment: try again, bounded.
        deadline = time.monotonic() + WAL_SWITCH_TIMEOUT_S
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _migrate(self) -> None:
        self._db.execute(VERSION_TABLE.format(real="REAL"))
        applied = {row[0] for row in self._db.execute("SELECT version FROM schema_migrations")}
        if LATEST in applied and len(applied) == len(MIGRATIONS):
            return
        self._db.execute("BEGIN IMMEDIATE")  # another process may be migrating the same file: read again under the lock
        try:
            applied = {row[0] for row in self._db.execute("SELECT version FROM schema_migrations")}
            for migration in MIGRATIONS:
                if migration.version not in applied:
                    self._apply(migration)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _apply(self, migration: Migration) -> None:
        for statement in migration.sql("sqlite"):
            self._db.execute(statement)
        for table, name, declaration in migration.added_columns:
            present = {row["name"] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if name not in present:  # added in place by a build older than the version table
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
        self._db.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.name, time.time()),
        )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    async def aclose(self) -> None:
        self.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return fn(self._db)

        return await asyncio.to_thread(call)

    async def _write(self, fn: Callable[[sqlite3.Connection], sqlite3.Cursor]) -> None:
        """A statement whose cursor is closed under the lock: a cursor left to the garbage collector
        is finalised on whichever thread drops it, racing the next statement on the connection."""

        def write(db: sqlite3.Connection) -> None:
            fn(db).close()

        await self._run(write)

    async def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        await self._write(lambda db: db.execute(sql, params))

    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return await self._run(lambda db: db.execute(sql, params).fetchall())

    # -- tenants --------------------------------------------------------------------------------

    async def put_tenant(
        self, name: str, token_sha256: str, *, origin: Origin = "config", expires_at: float | None = None,
    ) -> None:
        await self._execute(
            "INSERT INTO tenants (name, token_sha256, created_at, origin, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET token_sha256 = excluded.token_sha256, origin = excluded.origin, "
            "expires_at = excluded.expires_at, revoked_at = NULL",
            (name, token_sha256, time.time(), origin, expires_at),
        )

    async def tenant_tokens(self) -> dict[str, Tenant]:
        return {r.token_sha256: Tenant(r.name) for r in await self.tenant_records() if r.revoked_at is None}

    async def tenant_records(self) -> list[TenantRecord]:
        return [tenant_of(row) for row in await self._fetch("SELECT * FROM tenants ORDER BY name")]

    async def revoke_tenant(self, name: str, at: float) -> None:
        await self._execute("UPDATE tenants SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (at, name))

    async def delete_tenant(self, name: str) -> None:
        await self._execute("DELETE FROM tenants WHERE name = ?", (name,))
        await self._execute("DELETE FROM sandbox_cpu WHERE tenant = ?", (name,))
        await self._execute("DELETE FROM session_egress WHERE tenant = ?", (name,))

    async def put_sandbox_cpu(self, sandbox_id: str, tenant: str, cpu_seconds: float) -> None:
        await self._execute(
            "INSERT INTO sandbox_cpu (sandbox_id, tenant, cpu_seconds) VALUES (?, ?, ?) ON CONFLICT (sandbox_id) "
            "DO UPDATE SET cpu_seconds = max(sandbox_cpu.cpu_seconds, excluded.cpu_seconds)",
            (sandbox_id, tenant, cpu_seconds),
        )

    async def tenant_cpu_seconds(self, tenant: str) -> float:
        rows = await self._fetch(
            "SELECT coalesce(sum(cpu_seconds), 0) AS s FROM sandbox_cpu WHERE tenant = ?", (tenant,)
        )
        return float(rows[0]["s"])

    async def add_session_egress(self, session_id: str, tenant: str, added_bytes: int) -> None:
        await self._execute(
            "INSERT INTO session_egress (session_id, tenant, total_bytes) VALUES (?, ?, ?) "
            "ON CONFLICT (session_id) DO UPDATE SET total_bytes = session_egress.total_bytes + excluded.total_bytes",
            (session_id, tenant, added_bytes),
        )

    async def session_egress_bytes(self, session_id: str) -> int:
        rows = await self._fetch("SELECT total_bytes FROM session_egress WHERE session_id = ?", (session_id,))
        return int(rows[0]["total_bytes"]) if rows else 0

    async def tenant_egress_bytes(self, tenant: str) -> int:
        rows = await self._fetch(
            "SELECT coalesce(sum(total_bytes), 0) AS s FROM session_egress WHERE tenant = ?", (tenant,)
        )
        return int(rows[0]["s"])

    async def mark_tenant_deleting(self, name: str, at: float) -> None:
        await self._execute(
            "UPDATE tenants SET deleting_at = ?, revoked_at = COALESCE(revoked_at, ?) WHERE name = ?",
            (at, at, name),
        )

    async def purge_tenant(self, name: str) -> None:
        owned = "SELECT id FROM sessions WHERE tenant = ?"
        # One statement each, children first: a crash between them leaves sessions whose leftovers a retry
        # (the next create of the name) removes, never leftovers without their session.
        await self._execute(f"DELETE FROM approvals WHERE session_id IN ({owned})", (name,))
        await self._execute(f"DELETE FROM todos WHERE session_id IN ({owned})", (name,))
        await self._execute("DELETE FROM sessions WHERE tenant = ?", (name,))
        # A sandbox removed after the delete began records its CPU late: the new tenant must not inherit it.
        await self._execute("DELETE FROM sandbox_cpu WHERE tenant = ?", (name,))
        await self._execute("DELETE FROM session_egress WHERE tenant = ?", (name,))

    async def set_tenant_quota(self, name: str, quota: Quota) -> None:
        await self._execute("UPDATE tenants SET quota_json = ? WHERE name = ?", (json.dumps(quota.to_dict()), name))

    async def admin_token_sha256(self) -> str | None:
        rows = await self._fetch("SELECT token_sha256 FROM admin_tokens WHERE name = 'admin'")
        return str(rows[0]["token_sha256"]) if rows else None

    async def put_admin_token(self, token_sha256: str) -> None:
        await self._execute(
            "INSERT INTO admin_tokens (name, token_sha256, created_at) VALUES ('admin', ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET token_sha256 = excluded.token_sha256, created_at = excluded.created_at",
            (token_sha256, time.time()),
        )

    # -- sessions -------------------------------------------------------------------------------

    async def put_session(self, s: Session) -> None:
        await self._execute(session_upsert("?"), session_values(s))

    async def touch_session(self, session_id: str, at: float) -> None:
        await self._execute("UPDATE sessions SET last_active_at = ? WHERE id = ?", (at, session_id))

    async def claim_paused(self, session_id: str, holder: str, at: float, stale_before: float) -> str:
        def claim(db: sqlite3.Connection) -> str:
            db.execute(resume_claims.CLAIM, (holder, at, session_id, holder, stale_before)).close()
            row = db.execute(resume_claims.HOLDER, (session_id,)).fetchone()
            return str(row["resume_holder"]) if row is not None and row["state"] == "PAUSED" else ""

        return await self._run(claim)

    async def put_resumed(self, s: Session, holder: str) -> bool:
        def put(db: sqlite3.Connection) -> bool:
            cursor = db.execute(resume_claims.RESUMED, (s.sandbox_id, s.last_active_at, s.id, holder))
            stored = cursor.rowcount > 0
            cursor.close()
            return stored

        return await self._run(put)

    async def release_claim(self, session_id: str, holder: str) -> None:
        await self._execute(resume_claims.RELEASE, (session_id, holder))

    async def get_session(self, session_id: str) -> Session | None:
        row = await self._run(lambda db: db.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone())
        return session_of(row) if row else None

    async def list_sessions(self, tenant: str | None = None, live_only: bool = False,
                            with_paused: bool = False) -> list[Session]:
        sql, params = "SELECT * FROM sessions WHERE 1=1", []
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        if live_only:
            sql += " AND state IN ('CREATING', 'READY', 'PAUSED')" if with_paused else \
                " AND state IN ('CREATING', 'READY')"
        rows = await self._run(lambda db: db.execute(sql + " ORDER BY created_at", params).fetchall())
        return [session_of(row) for row in rows]

    # -- approvals, todos ----------------------------------------------------------------------

    async def load_approvals(self, session_id: str) -> list[Rule]:
        rows = await self._run(lambda db: db.execute(
            "SELECT permission, pattern FROM approvals WHERE session_id = ? ORDER BY seq", (session_id,)
        ).fetchall())
        return [Rule(r["permission"], r["pattern"], "allow") for r in rows]

    async def add_approvals(self, session_id: str, rules: list[Rule]) -> None:
        now = time.time()
        await self._write(lambda db: db.executemany(
            "INSERT INTO approvals (session_id, permission, pattern, created_at) VALUES (?,?,?,?)",
            [(session_id, r.permission, r.pattern, now) for r in rules],
        ))

    async def get_todos(self, session_id: str) -> list[dict[str, Any]]:
        row = await self._run(
            lambda db: db.execute("SELECT todos_json FROM todos WHERE session_id = ?", (session_id,)).fetchone()
        )
        todos: list[dict[str, Any]] = json.loads(row["todos_json"]) if row else []
        return todos

    async def put_todos(self, session_id: str, todos: list[dict[str, Any]]) -> None:
        # A multi-MiB list (todowrite's arguments may be) is encoded off the loop every tenant shares.
        text = await asyncio.to_thread(json.dumps, todos, ensure_ascii=False) if len(todos) > 256 else json.dumps(
            todos, ensure_ascii=False)
        await self._execute(
            "INSERT OR REPLACE INTO todos (session_id, todos_json, updated_at) VALUES (?,?,?)",
            (session_id, text, time.time()),
        )

    # -- audit ----------------------------------------------------------------------------------

    async def add_audit(self, entries: list[AuditEntry]) -> None:
        await self._write(lambda db: db.executemany(
            "INSERT INTO audit (time, tenant, session_id, kind, tool, call_id, outcome, permission, patterns, rule,"
            " detail) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [(e.time, e.tenant, e.session_id, e.kind, e.tool, e.call_id, e.outcome, e.permission,
              json.dumps(list(e.patterns), ensure_ascii=False), e.rule, e.detail) for e in entries],
        ))

    async def audit_entries(self, tenant: str, session_id: str = "") -> list[AuditEntry]:
        sql, params = "SELECT * FROM audit WHERE tenant = ?", [tenant]
        if session_id:
            sql += " AND session_id = ?"
            params.append(session_id)
        rows = await self._run(lambda db: db.execute(sql + " ORDER BY seq", params).fetchall())
        return [audit_entry_of(r) for r in rows]

    # -- sandboxes (SandboxLedger) --------------------------------------------------------------

    async def put_sandbox(self, record: SandboxRecord) -> None:
        await self._execute(
            "INSERT OR REPLACE INTO sandboxes (id, instance, state, session_id, created_at) VALUES (?,?,?,?,?)",
            (record.id, record.instance, record.state, record.session_id, record.created_at),
        )

    async def claim_sandbox(self, sandbox_id: str, session_id: str) -> None:
        await self._execute(
            "UPDATE sandboxes SET state = 'claimed', session_id = ? WHERE id = ?", (session_id, sandbox_id)
        )

    async def forget_sandbox(self, sandbox_id: str) -> None:
        await self._execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))

    async def list_sandboxes(self, instance: str) -> list[SandboxRecord]:
        rows = await self._run(
            lambda db: db.execute("SELECT * FROM sandboxes WHERE instance = ?", (instance,)).fetchall()
        )
        return [sandbox_of(r) for r in rows]


    # -- host reservations (core/sessions/capacity.ReservationBook) -------------------------------

    async def _in_transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn` under BEGIN IMMEDIATE: the write lock from the first read on, against every process on the file."""

        def run(db: sqlite3.Connection) -> T:
            db.execute("BEGIN IMMEDIATE").close()
            try:
                result = fn(db)
            except BaseException:
                db.execute("ROLLBACK").close()
                raise
            db.execute("COMMIT").close()
            return result

        return await self._run(run)

    async def take_host_reservation(self, claim: Claim, now: float, lease_s: float,
                                    check: Callable[[HostUse], None]) -> None:
        def take(db: sqlite3.Connection) -> None:
            for statement, params in host_book.forget_expired(claim.host, now):
                db.execute(statement, params).close()
            check(host_book.use_of(db.execute(host_book.SUM, (claim.host,)).fetchone()))
            db.execute(host_book.INSERT, host_book.insert_params(claim, now)).close()

        await self._in_transaction(take)

    async def put_host_reservations(self, host: str, plane: str, claims: list[Claim], now: float,
                                    lease_s: float) -> None:
        def put(db: sqlite3.Connection) -> None:
            db.execute(host_book.DROP_PLANE, (host, plane)).close()
            db.executemany(host_book.INSERT, [host_book.insert_params(c, now) for c in claims]).close()
            db.execute(host_book.PUT_LEASE, (host, plane, now + lease_s)).close()

        await self._in_transaction(put)

    async def keep_host_reservation(self, holder: str, claim: Claim) -> None:
        def keep(db: sqlite3.Connection) -> None:
            db.execute(host_book.DROP, (holder,)).close()
            db.execute(host_book.INSERT, host_book.insert_params(claim, time.time())).close()

        await self._in_transaction(keep)

    async def drop_host_reservation(self, holder: str) -> None:
        await self._execute(host_book.DROP, (holder,))

    async def host_use(self, host: str, now: float) -> HostUse:
        rows = await self._fetch(host_book.LIVE_SUM, (host, host, now))
        return host_book.use_of(rows[0])

    async def renew_host_lease(self, host: str, plane: str, now: float, lease_s: float) -> bool:
        def renew(db: sqlite3.Connection) -> bool:
            cursor = db.execute(host_book.RENEW, (now + lease_s, host, plane, now))
            renewed = cursor.rowcount > 0
            cursor.close()
            if not renewed:
                db.execute(host_book.PUT_LEASE, (host, plane, now + lease_s)).close()
            return renewed

        return await self._in_transaction(renew)
