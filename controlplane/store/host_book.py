"""The host reservations' SQL (core/sessions/capacity.ReservationBook), one text for SQLite and PostgreSQL.

Written with `?` placeholders; `sql(statement, "postgres")` gives psycopg's `%s`. Each store runs a take
in one transaction under a per-host lock (SQLite: BEGIN IMMEDIATE, the database's single writer;
PostgreSQL: a transaction-scoped advisory lock on the host's name), so the sum it checks is the sum it
adds to, whichever plane reads it next.
"""

from __future__ import annotations

from typing import Any

from controlplane.core.sessions.capacity import Claim, HostUse
from controlplane.store.migrations import Dialect

HOST_LOCK_PREFIX = "ocsb-host:"
"""Prefixed to the host's name for PostgreSQL's advisory lock key (hashtext)."""

FORGET_EXPIRED = (
    # A plane without a live lease on this host: died, or stopped and not back yet.
    "DELETE FROM host_reservations WHERE host = ? AND plane NOT IN "
    "(SELECT plane FROM host_leases WHERE host = ? AND lease_until >= ?)",
    "DELETE FROM host_leases WHERE host = ? AND lease_until < ?",
)
SUM = (
    "SELECT COALESCE(SUM(slots), 0) AS slots, COALESCE(SUM(cpu), 0) AS cpu, "
    "COALESCE(SUM(memory_mb), 0) AS memory_mb, COALESCE(SUM(disk_mb), 0) AS disk_mb "
    "FROM host_reservations WHERE host = ?"
)
LIVE_SUM = SUM + " AND plane IN (SELECT plane FROM host_leases WHERE host = ? AND lease_until >= ?)"
INSERT = (
    "INSERT INTO host_reservations (holder, host, plane, slots, cpu, memory_mb, disk_mb, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (holder) DO UPDATE SET host = excluded.host, "
    "plane = excluded.plane, slots = excluded.slots, cpu = excluded.cpu, memory_mb = excluded.memory_mb, "
    "disk_mb = excluded.disk_mb"
)
DROP = "DELETE FROM host_reservations WHERE holder = ?"
DROP_PLANE = "DELETE FROM host_reservations WHERE host = ? AND plane = ?"
RENEW = "UPDATE host_leases SET lease_until = ? WHERE host = ? AND plane = ? AND lease_until >= ?"
PUT_LEASE = (
    "INSERT INTO host_leases (host, plane, lease_until) VALUES (?, ?, ?) "
    "ON CONFLICT (host, plane) DO UPDATE SET lease_until = excluded.lease_until"
)


def sql(statement: str, dialect: Dialect) -> str:
    return statement.replace("?", "%s") if dialect == "postgres" else statement


def forget_expired(host: str, now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements, with their parameters, that forget the reservations of planes whose lease ran out."""
    return list(zip(FORGET_EXPIRED, [(host, host, now), (host, now)], strict=True))


def insert_params(claim: Claim, now: float) -> tuple[Any, ...]:
    return (claim.holder, claim.host, claim.plane, claim.slots, claim.cpu, claim.memory_mb, claim.disk_mb, now)


def use_of(row: Any) -> HostUse:
    return HostUse(int(row["slots"]), float(row["cpu"]), int(row["memory_mb"]), int(row["disk_mb"]))
