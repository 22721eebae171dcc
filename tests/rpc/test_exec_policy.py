"""SandboxService.Exec under the operator's `exec` policy, per tenant, and every Exec in the audit record."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.core.permissions.audit import AuditEntry
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"},
           {"name": "gamma", "token": "token-gamma"}]
POLICY = {
    "permission": {"exec": {"*": "allow", "rm *": "deny"}, "*": "deny"},
    "tenants": {"beta": {"exec": "deny"}, "gamma": {"exec": {"cat *": "ask"}}},
}


plane = served_plane("local", scope="function", tenants=TENANTS, policy=POLICY, pool={"size": 0})


async def audited(plane: Plane, tenant: str, session_id: str) -> list[AuditEntry]:
    await plane.plane.audit.flush()
    return [e for e in await plane.plane.store.audit_entries(tenant, session_id) if e.tool == "exec"]


async def denied(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, info.value.details()
    return info.value.details() or ""


async def test_exec_is_allowed_by_default_and_denied_where_the_policy_says(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    done = await alpha.run(session.id, ["sh", "-c", "echo hi; exit 3"])  # the catch-all `*` deny is for tools
    assert (done.exit_code, done.stdout) == (3, b"hi\n")
    assert await denied(alpha.run(session.id, ["rm", "-rf", "/workspace/x"])) == (
        "the operator's policy does not allow this command in a sandbox (rule: exec rm * deny (operator))"
    )
    assert await denied(alpha.run(session.id, command="rm -f y")) != ""
    entries = await audited(plane, "alpha", session.id)
    assert [(e.kind, e.outcome, e.patterns, e.detail) for e in entries] == [
        ("permission", "allow", ("sh -c 'echo hi; exit 3'",), ""),
        ("exec", "error", ("sh -c 'echo hi; exit 3'",), "exit 3"),
        ("permission", "deny", ("rm -rf /workspace/x",), ""),
        ("permission", "deny", ("rm -f y",), ""),
    ]
    assert entries[0].rule == "exec * allow (operator)"
    assert entries[2].rule == "exec rm * deny (operator)"
    assert {e.tenant for e in entries} == {"alpha"}
    assert {e.session_id for e in entries} == {session.id}


async def test_a_tenant_denied_exec_cannot_run_anything_and_ask_is_a_refusal(plane: Plane) -> None:
    async with AsyncClient(plane.plane.address, "token-beta") as beta:
        session = await beta.create_session()
        await denied(beta.run(session.id, ["true"]))
        await beta.delete_session(session.id)
    [entry] = await audited(plane, "beta", session.id)
    assert (entry.outcome, entry.rule) == ("deny", "exec * deny (operator)")
    async with AsyncClient(plane.plane.address, "token-gamma") as gamma:
        session = await gamma.create_session()
        assert (await gamma.run(session.id, ["echo", "ok"])).stdout == b"ok\n"
        await denied(gamma.run(session.id, ["cat", "/etc/hostname"]))
        await gamma.delete_session(session.id)


async def test_a_successful_and_an_aborted_exec_are_audited(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session()
    assert (await alpha.run(session.id, ["true"])).exit_code == 0
    call = alpha.exec_call(session.id, ["sleep", "30"])
    await anext(aiter(call))
    call.cancel()
    for _ in range(100):
        outcomes = [(e.kind, e.outcome) for e in await audited(plane, "alpha", session.id)]
        if len(outcomes) == 4:
            break
        await asyncio.sleep(0.05)
    assert outcomes == [("permission", "allow"), ("exec", "ok"), ("permission", "allow"), ("exec", "cancelled")]
