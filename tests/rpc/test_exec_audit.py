"""Everything about an Exec is in the audit record: the stdin it received (bounded), how it ended, and the
Execs and tool calls refused before they ran (by the calls quota, or for a revoked token)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.core.permissions.audit import AuditEntry
from tests.planes import Plane, served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "alpha", "token": "token-alpha", "quota": {"calls": 1}},
    {"name": "sigma", "token": "token-sigma"},
    {"name": "omega", "token": "token-omega"},  # revoked by a test: no per-test client
]
USED_UP = ("tenant alpha's quota of 1 concurrent calls is used up (1 running); "
           "wait for a call to end or ask the operator to raise it")

plane = served_plane("local", scope="module", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS[:2])


async def audited(plane: Plane, tenant: str, session_id: str) -> list[AuditEntry]:
    await plane.plane.audit.flush()
    return [e for e in await plane.plane.store.audit_entries(tenant) if e.session_id == session_id]


async def settled(plane: Plane, tenant: str, session_id: str, count: int) -> list[AuditEntry]:
    """The session's rows once `count` Execs have their end recorded: the handler writes it as it finishes,
    which may be just after the client has read the exit status."""
    for _ in range(100):
        rows = await audited(plane, tenant, session_id)
        if sum(e.kind == "exec" for e in rows) >= count:
            return rows
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} Exec ends recorded: {rows}")


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_the_stdin_an_exec_received_is_recorded_and_bounded(
    clients: dict[str, AsyncClient], plane: Plane,
) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    data = bytes(range(32, 127)) * 1100  # 104,500 bytes: more than the 64 KiB kept
    done = await alpha.run(session.id, ["wc", "-c"], stdin=chunks(data[:50_000], data[50_000:]))
    assert done.stdout.strip() == str(len(data)).encode()
    small = await alpha.run(session.id, ["cat"], stdin=chunks(b"rm -rf x\n", b"\xff\xfe tail"))
    assert small.stdout == b"rm -rf x\n\xff\xfe tail"
    rows = [e for e in await settled(plane, "alpha", session.id, 2) if e.kind in ("stdin", "exec")]
    assert [(e.kind, e.outcome, e.detail) for e in rows] == [
        ("stdin", "cut", f"{len(data)} bytes received; only the first 65536 recorded; closed by the client"),
        ("exec", "ok", "exit 0"),
        ("stdin", "whole", "16 bytes received; closed by the client"),
        ("exec", "ok", "exit 0"),
    ]
    assert rows[0].patterns == (data[:65536].decode(),)
    assert rows[2].patterns == ("rm -rf x\n\\xff\\xfe tail",)  # bytes that are not UTF-8 show escaped
    assert (rows[1].patterns, rows[3].patterns) == (("wc -c",), ("cat",))


async def test_how_an_exec_ended_is_recorded(clients: dict[str, AsyncClient], plane: Plane) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    assert (await alpha.run(session.id, ["sleep", "5"], timeout_ms=200)).timed_out
    assert (await alpha.run(session.id, command="kill -KILL $$")).signal
    assert (await alpha.run(session.id, command="exit 7")).exit_code == 7
    ended = [(e.outcome, e.detail) for e in await settled(plane, "alpha", session.id, 3) if e.kind == "exec"]
    assert ended[0] == ("error", "timed out")
    assert ended[1][0] == "error"
    assert ended[1][1].startswith("signal ")
    assert ended[2] == ("error", "exit 7")


async def test_execs_and_tool_calls_refused_by_the_calls_quota_are_audited(
    clients: dict[str, AsyncClient], plane: Plane,
) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    long = alpha.exec_call(session.id, ["sleep", "30"])
    assert (await anext(aiter(long))).WhichOneof("event") == "started_pid"
    for call in (alpha.run(session.id, ["true"]), alpha.execute_tool(session.id, "read", {"filePath": "x"})):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    long.cancel()
    # Refused before their first message, these name no session.
    refused = [(e.kind, e.tool, e.outcome, e.rule, e.detail) for e in await audited(plane, "alpha", "")]
    assert refused == [("exec", "exec", "denied", "quota calls", USED_UP),
                       ("call", "", "denied", "quota calls", USED_UP)]


async def test_an_exec_with_a_revoked_token_is_audited_under_its_tenant(plane: Plane) -> None:
    token = plane.plane.settings.admin_token_file.read_text().strip()
    async with AsyncClient(plane.plane.address, "token-omega") as omega:
        session = await omega.create_session()
        async with AsyncAdminClient(plane.plane.address, token) as admin:
            await admin.revoke_token("omega")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await omega.run(session.id, ["true"], stdin=chunks(b"data"))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Anyone can send a token no tenant holds: that names no one, and leaves no row.
    async with AsyncClient(plane.plane.address, "token-nobody") as nobody:
        with pytest.raises(grpc.aio.AioRpcError):
            await nobody.run(session.id, ["true"])
    rows = [(e.kind, e.tool, e.outcome, e.rule, e.detail) for e in await audited(plane, "omega", "")]
    assert rows == [("exec", "exec", "denied", "authentication", "bearer token revoked")]
    await plane.plane.audit.flush()
    assert await plane.plane.store.audit_entries("") == []


async def test_an_exec_into_a_session_not_the_tenants_is_audited(clients: dict[str, AsyncClient], plane: Plane) -> None:
    theirs = await clients["sigma"].create_session()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await clients["alpha"].run(theirs.id, ["cat", "/workspace/secret"])
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    [row] = await audited(plane, "alpha", theirs.id)
    assert (row.kind, row.outcome, row.patterns, row.rule) == (
        "exec", "denied", ("cat /workspace/secret",), "request not_found"
    )
    assert row.detail == info.value.details()
    assert await audited(plane, "sigma", theirs.id) == []  # nothing lands in the other tenant's record
