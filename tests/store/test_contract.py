"""One contract, two stores: every test runs against SQLite and against a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from controlplane.config import load_settings
from controlplane.core.permissions.audit import AuditEntry
from controlplane.core.permissions.permission import Rule
from controlplane.core.seam.provider import SandboxRecord
from controlplane.core.sessions.models import NetworkPolicy, Resources, Session, SessionState, Tenant
from controlplane.core.tenants.quota import Quota
from controlplane.errors import ConfigError
from controlplane.store.base import AUDIT_BATCH, AuditWriter, Store, describe, open_store
from controlplane.store.migrations import LATEST, MIGRATIONS, Dialect
from controlplane.store.postgres import PostgresStore, StoreUnavailableError
from controlplane.store.sqlite import SqliteStore

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
Opener = Callable[[], Awaitable[Store]]


def _conforms(sqlite: SqliteStore, postgres: PostgresStore) -> tuple[Store, Store]:
    """mypy --strict checks here that both stores implement the whole protocol."""
    return sqlite, postgres


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(kind, url): a fresh SQLite file or a fresh PostgreSQL database."""
    if request.param == "postgres":
        return "postgres", str(request.getfixturevalue("pg_url"))
    return "sqlite", f"sqlite://{tmp_path / 'state.db'}"


@pytest.fixture
def opener(target: tuple[str, str], tmp_path: Path) -> Opener:
    """Opens another store on the same data (as a second control plane would)."""

    async def open_() -> Store:
        return await open_store(target[1], tmp_path)

    return open_


@pytest.fixture
async def store(opener: Opener) -> AsyncIterator[Store]:
    opened = await opener()
    yield opened
    await opened.aclose()


def _query(target: tuple[str, str], sql: str) -> list[tuple[Any, ...]]:
    kind, url = target
    if kind == "sqlite":
        db = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def _session(sid: str, tenant: str = "acme", created: float = 1.5, **kw: Any) -> Session:
    return Session(
        id=sid, tenant=tenant, agent="build", state=kw.pop("state", SessionState.READY),
        resources=Resources(0.5, 256, 128), created_at=created, last_active_at=created + 0.25, **kw,
    )


# -- schema and migrations --------------------------------------------------------------------------


async def test_a_new_store_records_every_migration_once(store: Store, opener: Opener, target: tuple[str, str]) -> None:
    again = await opener()  # opening a migrated store applies nothing twice
    await again.aclose()
    rows = _query(target, "SELECT version, name FROM schema_migrations ORDER BY version")
    assert rows == [(m.version, m.name) for m in MIGRATIONS]
    assert rows[-1][0] == LATEST == 10


async def test_stores_opened_at_once_on_a_new_database_migrate_it_once(
    opener: Opener, target: tuple[str, str],
) -> None:
    stores = await asyncio.gather(*(opener() for _ in range(4)))
    try:
        assert _query(target, "SELECT count(*) FROM schema_migrations") == [(len(MIGRATIONS),)]
        await stores[0].put_todos("ses_1", [{"content": "x"}])
        assert await stores[3].get_todos("ses_1") == [{"content": "x"}]
    finally:
        for s in stores:
            await s.aclose()


async def test_data_from_before_the_version_table_is_migrated_in_place(
    target: tuple[str, str], opener: Opener,
) -> None:
    kind, url = target
    dialect: Dialect = "sqlite" if kind == "sqlite" else "postgres"
    first = MIGRATIONS[0].sql(dialect)
    row = ("INSERT INTO sessions (id, tenant, agent, state, sandbox_id, labels, resources, created_at,"
           " last_active_at) VALUES ('ses_old', 'acme', 'plan', 'READY', 'sb1', '{\"k\": \"v\"}',"
           " '{\"cpu\": 1.0, \"memory_mb\": 512, \"pids\": 256}', 1.0, 2.0)")
    if kind == "sqlite":
        db = sqlite3.connect(url.removeprefix("sqlite://"))
        for statement in [*first, row]:
            db.execute(statement)
        db.commit()
        db.close()
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in [*first, row]:
                conn.execute(statement)
    store = await opener()
    try:
        old = await store.get_session("ses_old")
        assert old == Session("ses_old", "acme", "plan", SessionState.READY, Resources(1.0, 512, 256), 1.0, 2.0,
                              sandbox_id="sb1", labels={"k": "v"}, parent_id="", title="")
        versions = _query(target, "SELECT version FROM schema_migrations ORDER BY version")
        assert versions == [(1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), (9,), (10,)]
    finally:
        await store.aclose()


# -- tenants --------------------------------------------------------------------------------------


async def test_tenants_are_upserted_by_name(store: Store) -> None:
    assert await store.tenant_tokens() == {}
    await store.put_tenant("acme", "a" * 64)
    await store.put_tenant("beta", "b" * 64)
    await store.put_tenant("acme", "c" * 64)  # a new token replaces the old one
    assert await store.tenant_tokens() == {"c" * 64: Tenant("acme"), "b" * 64: Tenant("beta")}


async def test_tenant_lifecycle_records(store: Store, opener: Opener) -> None:
    await store.put_tenant("acme", "a" * 64)
    await store.put_tenant("beta", "b" * 64, origin="api", expires_at=99.5)
    records = {r.name: r for r in await store.tenant_records()}
    assert (records["acme"].origin, records["acme"].expires_at, records["acme"].revoked_at) == ("config", None, None)
    assert (records["beta"].origin, records["beta"].expires_at, records["beta"].quota) == ("api", 99.5, Quota())
    await store.set_tenant_quota("beta", Quota(sessions=3, cpu=1.5, calls=-1))
    await store.revoke_tenant("acme", 42.0)
    await store.revoke_tenant("acme", 43.0)  # the first revocation's time stays
    other = await opener()  # what one control plane writes, another reads
    try:
        seen = {r.name: r for r in await other.tenant_records()}
    finally:
        await other.aclose()
    assert seen["acme"].revoked_at == 42.0
    assert seen["beta"].quota == Quota(sessions=3, cpu=1.5, calls=-1)
    assert await store.tenant_tokens() == {"b" * 64: Tenant("beta")}  # a revoked token is left out
    await store.put_tenant("acme", "d" * 64)  # declared again (or rotated): no longer revoked
    assert {r.name: r.revoked_at for r in await store.tenant_records()} == {"acme": None, "beta": None}
    await store.delete_tenant("beta")
    assert [r.name for r in await store.tenant_records()] == ["acme"]


async def test_a_tenant_purge_takes_its_sessions_approvals_and_todos_and_keeps_the_audit(store: Store) -> None:
    await store.put_tenant("acme", "a" * 64)
    await store.mark_tenant_deleting("acme", 7.0)
    assert [(r.revoked_at, r.deleting_at) for r in await store.tenant_records()] == [(7.0, 7.0)]
    for sid, tenant in (("ses_a", "acme"), ("ses_b", "beta")):
        await store.put_session(_session(sid, tenant=tenant, state=SessionState.DELETED, deleted_at=2.0))
        await store.add_approvals(sid, [Rule("bash", "git *", "allow")])
        await store.put_todos(sid, [{"content": "x", "status": "pending", "priority": "low"}])
        await store.add_audit([AuditEntry(tenant, sid, "call", "bash", "c1", "ok")])
    await store.delete_tenant("acme")
    await store.purge_tenant("acme")
    assert [s.id for s in await store.list_sessions()] == ["ses_b"]
    assert await store.get_session("ses_a") is None
    assert (await store.load_approvals("ses_a"), await store.get_todos("ses_a")) == ([], [])
    assert len(await store.load_approvals("ses_b")) == 1  # another tenant's stay
    assert len(await store.get_todos("ses_b")) == 1
    assert [e.session_id for e in await store.audit_entries("acme")] == ["ses_a"]  # the operator's record


async def test_the_admin_token_is_one_replaceable_digest(store: Store) -> None:
    assert await store.admin_token_sha256() is None
    await store.put_admin_token("e" * 64)
    await store.put_admin_token("f" * 64)
    assert await store.admin_token_sha256() == "f" * 64


# -- sessions -------------------------------------------------------------------------------------


async def test_a_session_reads_back_exactly(store: Store) -> None:
    session = _session(
        "ses_1", created=1763800000.123456, sandbox_id="0123456789ab", labels={"team": "ünï", "e": ""},
        config_json='{"permission": {"bash": "ask"}}', status_message="ok", parent_id="ses_0", title="Look ✓",
    )
    await store.put_session(session)
    assert await store.get_session("ses_1") == session
    assert await store.get_session("ses_missing") is None


async def test_a_sessions_own_caller_config_reads_back(store: Store) -> None:
    """The caller's config apart from the workspace's is what keeps the workspace from widening its rules
    after a restart (controlplane.core.permissions.rule_layers); None and "" differ."""
    for sid, caller in (("ses_1", '{"permission": {"bash": "deny"}}'), ("ses_2", ""), ("ses_3", None)):
        session = _session(sid, config_json='{"agent": {"md": {}}}', caller_config_json=caller)
        await store.put_session(session)
        got = await store.get_session(sid)
        assert got is not None
        assert got.caller_config_json == caller


async def test_a_sessions_template_reads_back_and_defaults_to_the_sandbox_image(store: Store) -> None:
    """A restarted plane must know which image a session runs on (the template it was created from)."""
    await store.put_session(_session("ses_1", template="node-20"))
    await store.put_session(_session("ses_2"))
    got, plain = await store.get_session("ses_1"), await store.get_session("ses_2")
    assert got is not None
    assert plain is not None
    assert (got.template, plain.template) == ("node-20", "default")


async def test_a_sessions_network_policy_reads_back(store: Store) -> None:
    """A restarted plane starts an adopted session's proxy from what the store kept; None (no network) and an
    empty-but-present policy stay apart."""
    policy = NetworkPolicy(("pkgs.test", "*.git.test:8443"), ("10.2.0.0/16",))
    for sid, network in (("ses_1", policy), ("ses_2", None)):
        await store.put_session(_session(sid, network=network))
        got = await store.get_session(sid)
        assert got is not None
        assert got.network == network


async def test_putting_a_session_again_replaces_it(store: Store) -> None:
    await store.put_session(_session("ses_1", state=SessionState.CREATING))
    ended = _session("ses_1", state=SessionState.DELETED, status_message="deleted", deleted_at=9.75)
    await store.put_session(ended)
    assert await store.get_session("ses_1") == ended
    assert [s.id for s in await store.list_sessions()] == ["ses_1"]


async def test_touch_moves_only_last_active(store: Store) -> None:
    await store.put_session(_session("ses_1"))
    await store.touch_session("ses_1", 42.5)
    await store.touch_session("ses_nobody", 43.0)  # unknown: nothing happens
    got = await store.get_session("ses_1")
    assert got is not None
    assert (got.last_active_at, got.created_at) == (42.5, 1.5)


async def test_sessions_list_by_tenant_and_liveness_in_creation_order(store: Store) -> None:
    await store.put_session(_session("ses_c", created=3.0))
    await store.put_session(_session("ses_a", created=1.0, state=SessionState.CREATING))
    await store.put_session(_session("ses_d", created=4.0, state=SessionState.FAILED))
    await store.put_session(_session("ses_b", created=2.0, tenant="beta"))
    await store.put_session(_session("ses_e", created=5.0, state=SessionState.DELETED, deleted_at=6.0))
    assert [s.id for s in await store.list_sessions()] == ["ses_a", "ses_b", "ses_c", "ses_d", "ses_e"]
    assert [s.id for s in await store.list_sessions("acme")] == ["ses_a", "ses_c", "ses_d", "ses_e"]
    assert [s.id for s in await store.list_sessions(live_only=True)] == ["ses_a", "ses_b", "ses_c"]
    assert [s.id for s in await store.list_sessions("acme", live_only=True)] == ["ses_a", "ses_c"]
    assert await store.list_sessions("nobody") == []
    # A paused session still holds quota (its disk): the store selects it with the live ones, nothing else.
    await store.put_session(_session("ses_f", created=7.0, state=SessionState.PAUSED))
    assert [s.id for s in await store.list_sessions("acme", live_only=True)] == ["ses_a", "ses_c"]
    assert [s.id for s in await store.list_sessions("acme", live_only=True, with_paused=True)] == [
        "ses_a", "ses_c", "ses_f"]


# -- approvals, todos -----------------------------------------------------------------------------


async def test_approvals_keep_their_order_per_session(store: Store) -> None:
    assert await store.load_approvals("ses_1") == []
    await store.add_approvals("ses_1", [Rule("bash", "git *", "allow"), Rule("edit", "*", "allow")])
    await store.add_approvals("ses_2", [Rule("read", "/etc/*", "allow")])
    await store.add_approvals("ses_1", [Rule("bash", "ls *", "allow")])
    await store.add_approvals("ses_1", [])
    assert await store.load_approvals("ses_1") == [
        Rule("bash", "git *", "allow"), Rule("edit", "*", "allow"), Rule("bash", "ls *", "allow"),
    ]
    assert await store.load_approvals("ses_2") == [Rule("read", "/etc/*", "allow")]


async def test_todos_are_replaced_whole_and_keep_unicode(store: Store) -> None:
    assert await store.get_todos("ses_1") == []
    first = [{"content": "écrire ✓", "status": "pending", "priority": "high", "id": "1"}]
    await store.put_todos("ses_1", first)
    assert await store.get_todos("ses_1") == first
    await store.put_todos("ses_1", [])
    assert await store.get_todos("ses_1") == []
    assert await store.get_todos("ses_2") == []


async def test_a_large_todo_list_is_stored_whole(store: Store) -> None:
    many = [{"content": f"item {i}", "status": "pending", "priority": "low"} for i in range(1000)]
    await store.put_todos("ses_1", many)
    assert await store.get_todos("ses_1") == many


async def test_sandbox_cpu_time_adds_up_per_tenant_counts_a_sandbox_once_and_goes_with_its_tenant(
    store: Store,
) -> None:
    assert await store.tenant_cpu_seconds("acme") == 0
    await store.put_tenant("acme", "a" * 64)
    await store.put_sandbox_cpu("sbx1", "acme", 1.5)
    await store.put_sandbox_cpu("sbx2", "acme", 0.25)
    await store.put_sandbox_cpu("sbx3", "beta", 4.0)
    # A removal tried again reads the sandbox again: its last (largest) reading counts, once.
    await store.put_sandbox_cpu("sbx1", "acme", 2.0)
    await store.put_sandbox_cpu("sbx1", "acme", 1.0)
    assert await store.tenant_cpu_seconds("acme") == 2.25
    assert await store.tenant_cpu_seconds("beta") == 4.0
    await store.delete_tenant("acme")
    assert await store.tenant_cpu_seconds("acme") == 0
    assert await store.tenant_cpu_seconds("beta") == 4.0


async def test_session_egress_bytes_add_up_per_session_and_tenant_and_go_with_the_tenant(store: Store) -> None:
    assert await store.tenant_egress_bytes("acme") == 0
    assert await store.session_egress_bytes("ses_1") == 0
    await store.put_tenant("acme", "a" * 64)
    await store.add_session_egress("ses_1", "acme", 1000)
    await store.add_session_egress("ses_2", "acme", 5 * 2**31)  # past 32 bits: a long session's downloads
    await store.add_session_egress("ses_3", "beta", 7)
    # A session adopted by a restarted control plane goes on from its stored figure.
    await store.add_session_egress("ses_1", "acme", 500)
    assert await store.session_egress_bytes("ses_1") == 1500
    assert await store.tenant_egress_bytes("acme") == 1500 + 5 * 2**31
    assert await store.tenant_egress_bytes("beta") == 7
    await store.delete_tenant("acme")
    assert await store.tenant_egress_bytes("acme") == 0
    assert await store.tenant_egress_bytes("beta") == 7


# -- audit ----------------------------------------------------------------------------------------


def _entry(i: int, session_id: str = "ses_1", tenant: str = "acme") -> AuditEntry:
    return AuditEntry(tenant=tenant, session_id=session_id, kind="call", tool="bash", call_id=f"call_{i}",
                      outcome="ok", permission="bash", patterns=("ls", f"é{i}"), rule="agent: bash * allow",
                      detail="", time=1000.0 + i / 8)


async def test_audit_entries_filter_by_tenant_and_session_in_order(store: Store) -> None:
    await store.add_audit([_entry(1), _entry(2, "ses_2"), _entry(3, tenant="beta")])
    await store.add_audit([_entry(4)])
    await store.add_audit([])
    assert await store.audit_entries("acme") == [_entry(1), _entry(2, "ses_2"), _entry(4)]
    assert await store.audit_entries("acme", "ses_1") == [_entry(1), _entry(4)]
    assert await store.audit_entries("beta") == [_entry(3, tenant="beta")]
    assert await store.audit_entries("nobody") == []


async def test_the_audit_writer_batches_and_loses_nothing_on_close(store: Store) -> None:
    writer = AuditWriter(store)
    total = AUDIT_BATCH * 2 + 7
    for i in range(total):
        await writer.record(_entry(i))
    assert await store.audit_entries("acme") == []  # nothing written on the caller's path
    await writer.close()
    assert [e.call_id for e in await store.audit_entries("acme")] == [f"call_{i}" for i in range(total)]


# -- sandboxes ------------------------------------------------------------------------------------


async def test_sandbox_records_by_instance(store: Store) -> None:
    await store.put_sandbox(SandboxRecord("sb1", "one", "creating", "", 1.0))
    await store.put_sandbox(SandboxRecord("sb2", "one", "pool", "", 2.0))
    await store.put_sandbox(SandboxRecord("sb3", "two", "claimed", "ses_9", 3.0))
    await store.put_sandbox(SandboxRecord("sb1", "one", "pool", "", 1.5))  # replaced
    await store.claim_sandbox("sb2", "ses_1")
    await store.claim_sandbox("sb_missing", "ses_2")
    assert sorted(await store.list_sandboxes("one"), key=lambda r: r.id) == [  # in no particular order
        SandboxRecord("sb1", "one", "pool", "", 1.5), SandboxRecord("sb2", "one", "claimed", "ses_1", 2.0),
    ]
    await store.forget_sandbox("sb1")
    await store.forget_sandbox("sb1")  # idempotent
    assert [r.id for r in await store.list_sandboxes("one")] == ["sb2"]
    assert await store.list_sandboxes("two") == [SandboxRecord("sb3", "two", "claimed", "ses_9", 3.0)]
    assert await store.list_sandboxes("three") == []


# -- two stores on the same data ------------------------------------------------------------------


async def test_a_second_store_sees_every_write_at_once(store: Store, opener: Opener) -> None:
    other = await opener()
    try:
        await store.put_session(_session("ses_1"))
        await store.add_approvals("ses_1", [Rule("bash", "make *", "allow")])
        await store.put_todos("ses_1", [{"content": "a", "status": "pending"}])
        assert await other.get_session("ses_1") == _session("ses_1")
        assert await other.load_approvals("ses_1") == [Rule("bash", "make *", "allow")]
        await other.put_todos("ses_1", [{"content": "b", "status": "completed"}])
        assert await store.get_todos("ses_1") == [{"content": "b", "status": "completed"}]
    finally:
        await other.aclose()


# -- opening by URL -------------------------------------------------------------------------------


async def test_the_default_url_is_the_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    store = await open_store("", tmp_path)
    try:
        assert isinstance(store, SqliteStore)
        assert store.path == tmp_path / "controlplane.db"
    finally:
        await store.aclose()


@pytest.mark.parametrize(("url", "message"), [
    ("mysql://x@h/db", "store.url must start with sqlite:// or postgresql://, got 'mysql'"),
    ("sqlite://relative.db", "store.url 'sqlite://relative.db': write an absolute SQLite path as "
                             "sqlite:///path/to/file.db"),
])
async def test_unknown_urls_are_config_errors(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        await open_store(url, tmp_path)
    assert str(err.value) == message
    with pytest.raises(ConfigError, match="invalid configuration") as err:
        load_settings(None, data_dir=tmp_path, store={"url": url})
    assert message in str(err.value)


def test_store_url_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_STORE__URL", "postgresql://cp:s3cret@db.internal:5433/ocsb")
    monkeypatch.setenv("CONTROLPLANE_STORE__POOL_SIZE", "3")
    settings = load_settings(None, data_dir=tmp_path)
    assert (settings.store.url, settings.store.pool_size) == ("postgresql://cp:s3cret@db.internal:5433/ocsb", 3)
    assert describe(settings.store.url) == "postgresql://cp:***@db.internal:5433/ocsb"
    assert describe("postgresql://cp@/ocsb?host=/tmp/s") == "postgresql://cp@/ocsb?host=/tmp/s"


@pytest.mark.postgres
async def test_an_unreachable_postgres_fails_start_clearly(tmp_path: Path) -> None:
    url = f"postgresql://ocsb@/ocsb?host={tmp_path}"  # no server listens there
    with pytest.raises(StoreUnavailableError) as err:
        await PostgresStore.open(url, connect_timeout_s=0.5)
    assert str(err.value) == f"PostgreSQL at {url} did not accept a connection within 0.5 s"


@pytest.mark.postgres
async def test_a_store_reports_the_server_going_away(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, pool_size=2)
    try:
        with psycopg.connect(pg_url, autocommit=True) as admin:  # ends every other connection to the database
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        # The pool checks connections it hands out, so the store recovers on its own.
        await store.put_todos("ses_1", [{"content": "after"}])
        assert await store.get_todos("ses_1") == [{"content": "after"}]
    finally:
        await store.aclose()
