"""The embedded store: tenants, sessions and sandbox records in one SQLite file (WAL mode).

Calls run in a worker thread so the event loop never blocks on the disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from controlplane.core.models import Resources, Session, SessionState, Tenant
from controlplane.sandbox.provider import SandboxRecord

T = TypeVar("T")

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS tenants (
        name TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL UNIQUE,
        created_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sessions (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        agent TEXT NOT NULL,
        state TEXT NOT NULL,
        sandbox_id TEXT NOT NULL DEFAULT '',
        labels TEXT NOT NULL DEFAULT '{}',
        resources TEXT NOT NULL,
        config_json TEXT NOT NULL DEFAULT '',
        status_message TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        last_active_at REAL NOT NULL,
        deleted_at REAL)""",
    "CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions (tenant, state)",
    """CREATE TABLE IF NOT EXISTS sandboxes (
        id TEXT PRIMARY KEY,
        instance TEXT NOT NULL,
        state TEXT NOT NULL,
        session_id TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL)""",
]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SqliteStore:
    """Implements the SandboxLedger too, so sandbox claims commit with session state."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        for statement in SCHEMA:
            self._db.execute(statement)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return fn(self._db)

        return await asyncio.to_thread(call)

    async def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        await self._run(lambda db: db.execute(sql, params))

    # -- tenants --------------------------------------------------------------------------------

    async def put_tenant(self, name: str, token_sha256: str) -> None:
        await self._execute(
            "INSERT INTO tenants (name, token_sha256, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET token_sha256 = excluded.token_sha256",
            (name, token_sha256, time.time()),
        )

    async def tenant_tokens(self) -> dict[str, Tenant]:
        rows = await self._run(lambda db: db.execute("SELECT name, token_sha256 FROM tenants").fetchall())
        return {row["token_sha256"]: Tenant(row["name"]) for row in rows}

    # -- sessions -------------------------------------------------------------------------------

    async def put_session(self, s: Session) -> None:
        await self._execute(
            "INSERT OR REPLACE INTO sessions (id, tenant, agent, state, sandbox_id, labels, resources, config_json,"
            " status_message, created_at, last_active_at, deleted_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                s.id, s.tenant, s.agent, s.state.value, s.sandbox_id, json.dumps(s.labels),
                json.dumps(s.resources.__dict__), s.config_json, s.status_message, s.created_at,
                s.last_active_at, s.deleted_at,
            ),
        )

    async def touch_session(self, session_id: str, at: float) -> None:
        await self._execute("UPDATE sessions SET last_active_at = ? WHERE id = ?", (at, session_id))

    async def get_session(self, session_id: str) -> Session | None:
        row = await self._run(lambda db: db.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone())
        return _session(row) if row else None

    async def list_sessions(self, tenant: str | None = None, live_only: bool = False) -> list[Session]:
        sql, params = "SELECT * FROM sessions WHERE 1=1", []
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        if live_only:
            sql += " AND state IN ('CREATING', 'READY')"
        rows = await self._run(lambda db: db.execute(sql + " ORDER BY created_at", params).fetchall())
        return [_session(row) for row in rows]

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
        return [SandboxRecord(r["id"], r["instance"], r["state"], r["session_id"], r["created_at"]) for r in rows]


def _session(row: sqlite3.Row) -> Session:
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
    )
