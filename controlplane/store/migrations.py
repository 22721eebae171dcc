"""The store's schema as numbered migrations, written once for SQLite and PostgreSQL.

Both dialects accept the same DDL except for two column types, written as `{real}` and `{serial}`.
A store records what it applied in `schema_migrations`; statements are idempotent, so a data dir
made before that table existed is brought up to date in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Dialect = Literal["sqlite", "postgres"]

TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {"real": "REAL", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    "postgres": {"real": "DOUBLE PRECISION", "serial": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"},
}


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...] = ()
    added_columns: tuple[tuple[str, str, str], ...] = field(default=())
    """(table, column, declaration): columns added to an existing table, skipped where present."""

    def sql(self, dialect: Dialect) -> list[str]:
        return [statement.format_map(TYPES[dialect]) for statement in self.statements]


VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at {real} NOT NULL)"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "tenants, sessions, sandboxes, approvals, todos, audit", (
        """CREATE TABLE IF NOT EXISTS tenants (
            name TEXT PRIMARY KEY,
            token_sha256 TEXT NOT NULL UNIQUE,
            created_at {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS sessions (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            agent TEXT NOT NULL,
            state TEXT NOT NULL,
            sandbox_id TEXT NOT NULL DEFAULT '',
            labels TEXT NOT NULL DEFAULT '{{}}',
            resources TEXT NOT NULL,
            config_json TEXT NOT NULL DEFAULT '',
            status_message TEXT NOT NULL DEFAULT '',
            created_at {real} NOT NULL,
            last_active_at {real} NOT NULL,
            deleted_at {real})""",
        "CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, state)",
        """CREATE TABLE IF NOT EXISTS sandboxes (
            id TEXT PRIMARY KEY,
            instance TEXT NOT NULL,
            state TEXT NOT NULL,
            session_id TEXT NOT NULL DEFAULT '',
            created_at {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS approvals (
            seq {serial},
            session_id TEXT NOT NULL,
            permission TEXT NOT NULL,
            pattern TEXT NOT NULL,
            created_at {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS approvals_session ON approvals (session_id, seq)",
        """CREATE TABLE IF NOT EXISTS todos (
            session_id TEXT PRIMARY KEY,
            todos_json TEXT NOT NULL,
            updated_at {real} NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS audit (
            seq {serial},
            time {real} NOT NULL,
            tenant TEXT NOT NULL,
            session_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            tool TEXT NOT NULL,
            call_id TEXT NOT NULL,
            outcome TEXT NOT NULL,
            permission TEXT NOT NULL,
            patterns TEXT NOT NULL,
            rule TEXT NOT NULL,
            detail TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS audit_session ON audit (tenant, session_id, seq)",
    )),
    Migration(2, "child sessions", added_columns=(
        ("sessions", "parent_id", "TEXT NOT NULL DEFAULT ''"),
        ("sessions", "title", "TEXT NOT NULL DEFAULT ''"),
    )),
    Migration(3, "the caller's own config of a session with project config", added_columns=(
        ("sessions", "caller_config_json", "TEXT"),
    )),
    # DOUBLE PRECISION has REAL affinity in SQLite, so one declaration serves both dialects.
    Migration(4, "tenant lifecycle: origin, expiry, revocation, quota; the admin token", (
        """CREATE TABLE IF NOT EXISTS admin_tokens (
            name TEXT PRIMARY KEY,
            token_sha256 TEXT NOT NULL,
            created_at {real} NOT NULL)""",
    ), added_columns=(
        ("tenants", "origin", "TEXT NOT NULL DEFAULT 'config'"),
        ("tenants", "expires_at", "DOUBLE PRECISION"),
        ("tenants", "revoked_at", "DOUBLE PRECISION"),
        ("tenants", "quota_json", "TEXT NOT NULL DEFAULT '{}'"),
    )),
    Migration(5, "a tenant's delete, marked so that a restart finishes it", added_columns=(
        ("tenants", "deleting_at", "DOUBLE PRECISION"),
    )),
    Migration(6, "the CPU time of each removed sandbox, for its tenant's usage", (
        """CREATE TABLE IF NOT EXISTS sandbox_cpu (
            sandbox_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            cpu_seconds {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS sandbox_cpu_tenant ON sandbox_cpu (tenant)",
    )),
    Migration(7, "the template each session runs", added_columns=(
        ("sessions", "template", "TEXT NOT NULL DEFAULT 'default'"),
    )),
    # BIGINT: a session's bytes pass 2**31 after 2 GiB; SQLite's INTEGER affinity stores it the same way.
    Migration(8, "the bytes each session sent and received through its network proxy, for its tenant's usage", (
        """CREATE TABLE IF NOT EXISTS session_egress (
            session_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            total_bytes BIGINT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS session_egress_tenant ON session_egress (tenant)",
    )),
    # Host admission across control planes (core/sessions/capacity.py): one row per reservation, each
    # under its plane's lease on that host.
    Migration(9, "host reservations and the leases of the planes holding them", (
        """CREATE TABLE IF NOT EXISTS host_reservations (
            holder TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            plane TEXT NOT NULL,
            slots INTEGER NOT NULL,
            cpu {real} NOT NULL,
            memory_mb BIGINT NOT NULL,
            disk_mb BIGINT NOT NULL,
            created_at {real} NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS host_reservations_host ON host_reservations (host, plane)",
        """CREATE TABLE IF NOT EXISTS host_leases (
            host TEXT NOT NULL,
            plane TEXT NOT NULL,
            lease_until {real} NOT NULL,
            PRIMARY KEY (host, plane))""",
    )),
    Migration(10, "the network policy of each session, so that a restarted plane starts its proxy again",
              added_columns=(
        ("sessions", "network_json", "TEXT"),
    )),
    # Which plane is resuming a PAUSED session, and since when (store/resume_claims.py): several planes on one
    # store must not each give it a sandbox.
    Migration(11, "the control plane resuming each paused session", added_columns=(
        ("sessions", "resume_holder", "TEXT NOT NULL DEFAULT ''"),
        ("sessions", "resume_claimed_at", "DOUBLE PRECISION NOT NULL DEFAULT 0"),
    )),
)
LATEST = MIGRATIONS[-1].version
