"""`batch` under the tenant's `calls` quota: each entry that runs takes a slot of its own while it runs (the
batch holds one too), and an entry that finds none fails with the quota's message, the others running."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient, ToolOutcome
from tests.planes import Plane, served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "alpha", "token": "token-alpha", "quota": {"calls": 4}},
    {"name": "beta", "token": "token-beta"},
]
BATCH = json.dumps({"experimental": {"batch_tool": True}, "permission": {"bash": "allow"}})
USED_UP = ("tenant alpha's quota of 4 concurrent calls is used up (4 running); "
           "wait for a call to end or ask the operator to raise it")

plane = served_plane("local", scope="module", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)


def entries(out: ToolOutcome) -> dict[str, tuple[str, str]]:
    """Each entry's ending (result or error, and its text) by call id."""
    found: dict[str, tuple[str, str]] = {}
    for event in out.events:
        kind = event.WhichOneof("event")
        if event.call_id != out.call_id and kind in ("result", "error"):
            found[event.call_id] = (str(kind), event.result.output if kind == "result" else event.error.message)
    return found


def sleepers(count: int) -> list[dict[str, Any]]:
    # Each entry holds its slot long enough for all ten to be asking at once.
    return [{"tool": "bash", "parameters": {"command": f"sleep 0.5; echo {i}", "description": f"Entry {i}"}}
            for i in range(count)]


async def test_a_batch_of_ten_with_four_slots_runs_three(clients: dict[str, AsyncClient], plane: Plane) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session(config_json=BATCH)
    out = await alpha.execute_tool(session.id, "batch", {"tool_calls": sleepers(10)})
    assert out.output == "Executed 3/10 tools successfully. 7 failed."
    endings = list(entries(out).values())
    assert sorted(kind for kind, _ in endings) == ["error"] * 7 + ["result"] * 3
    assert {text for kind, text in endings if kind == "error"} == {USED_UP}
    assert out.metadata["details"] == [{"tool": "bash", "success": ok} for ok in [True] * 3 + [False] * 7]
    # The refused entries are in the audit record, each under its own call id.
    await plane.plane.audit.flush()
    refused = [e for e in await plane.plane.store.audit_entries("alpha", session.id)
               if e.kind == "call" and e.outcome == "denied"]
    assert len(refused) == 7
    assert {(e.tool, e.rule, e.detail) for e in refused} == {("bash", "quota calls", USED_UP)}
    assert {e.call_id for e in refused} == {cid for cid, (kind, _) in entries(out).items() if kind == "error"}
    token = plane.plane.settings.admin_token_file.read_text().strip()
    async with AsyncAdminClient(plane.plane.address, token) as admin:
        for _ in range(100):  # every slot is released once the batch's handler ends
            if (await admin.usage("alpha")).calls == 0:
                break
            await asyncio.sleep(0.05)
        assert (await admin.usage("alpha")).calls == 0


async def test_a_batch_within_the_quota_runs_every_entry(clients: dict[str, AsyncClient]) -> None:
    alpha, beta = clients["alpha"], clients["beta"]
    session = await alpha.create_session(config_json=BATCH)
    out = await alpha.execute_tool(session.id, "batch", {"tool_calls": sleepers(3)})
    assert out.output.startswith("All 3 tools executed successfully.")
    # A tenant without a calls quota runs a full batch of 25.
    other = await beta.create_session(config_json=BATCH)
    calls = [{"tool": "bash", "parameters": {"command": f"echo {i}", "description": "Echo"}} for i in range(25)]
    out = await beta.execute_tool(other.id, "batch", {"tool_calls": calls})
    assert out.output.startswith("All 25 tools executed successfully.")
    assert sorted(text for _, text in entries(out).values()) == sorted(f"{i}\n" for i in range(25))


