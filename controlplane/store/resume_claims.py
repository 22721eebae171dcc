"""The resume claims' SQL (core/sessions/store_port.ResumeClaims), one text for SQLite and PostgreSQL.

Each statement is one conditional UPDATE, atomic in both stores (each runs in autocommit): the WHERE clause is
the compare, the SET the swap. So of several control planes resuming one PAUSED session, exactly one claims it,
and only the claim's holder can store it READY.
"""

from __future__ import annotations

from controlplane.store.migrations import Dialect

CLAIM = (
    # Free, already ours (this plane restarted mid-resume), or left by a plane that stopped (older than stale_before).
    "UPDATE sessions SET resume_holder = ?, resume_claimed_at = ? WHERE id = ? AND state = 'PAUSED' "
    "AND (resume_holder = '' OR resume_holder = ? OR resume_claimed_at < ?)"
)
HOLDER = "SELECT state, resume_holder FROM sessions WHERE id = ?"
RESUMED = (
    "UPDATE sessions SET state = 'READY', sandbox_id = ?, status_message = '', last_active_at = ?, "
    "resume_holder = '' WHERE id = ? AND state = 'PAUSED' AND resume_holder = ?"
)
RELEASE = "UPDATE sessions SET resume_holder = '' WHERE id = ? AND resume_holder = ?"


def sql(statement: str, dialect: Dialect) -> str:
    return statement.replace("?", "%s") if dialect == "postgres" else statement
