"""The control plane SIGKILLed in the middle of a burst of creates: after a restart the reconciler
leaves no orphan of the instance, and sessions, "always" approvals and todos survive."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from controlplane.client import AsyncClient, PermissionRequest
from controlplane.store.sqlite import SqliteStore
from controlplane.v1 import session_pb2, tool_pb2
from tests.planes import (
    PlaneProcess,
    instance_containers,
    instance_volumes,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    short_tmp,
)

pytestmark = pytest.mark.docker
BURST = 6
RECONCILED_WITHIN_S = 30.0
"""The issue's bound from the restart to a reconciled instance (measured about 1-3 s here)."""
CONFIG = json.dumps({"permission": {"bash": {"*": "allow", "git *": "ask"}}})
TODOS = [{"content": "survive a SIGKILL", "status": "in_progress", "priority": "high", "id": "1"}]


async def _always(_: PermissionRequest) -> tuple[int, str]:
    return tool_pb2.PermissionReply.ALWAYS, ""


async def _kept_state(client: AsyncClient, store: SqliteStore) -> session_pb2.Session:
    """A READY session with a file, an "always" approval and todos, all committed before the kill."""
    kept = await client.create_session(config_json=CONFIG)
    await client.run(kept.id, command="echo precious > notes.txt")
    out = await client.execute_tool(
        kept.id, "bash", {"command": "git status || true", "description": "Status"}, on_permission=_always
    )
    assert len(out.permission_requests) == 1
    tools = {t.id for t in (await client.list_tools(kept.id)).tools}
    if "todowrite" in tools:
        wrote = await client.execute_tool(kept.id, "todowrite", {"todos": TODOS})
        assert wrote.result is not None, wrote.error
    else:  # the todo tools are not in this build yet: the store's own API stands in for them
        await store.put_todos(kept.id, TODOS)
    return kept


async def _settled_pool(store: SqliteStore, instance: str) -> set[str]:
    """The warm pool's sandboxes once the restarted plane's refill is done (no record is `creating`)."""
    deadline = time.monotonic() + 30
    while any(r.state == "creating" for r in await store.list_sandboxes(instance)):
        assert time.monotonic() < deadline, "the warm pool never settled"
        await asyncio.sleep(0.1)
    return {r.id for r in await store.list_sandboxes(instance) if r.state == "pool"}


@pytest.mark.timeout(300)
async def test_sigkill_mid_burst_leaves_no_orphans_and_keeps_the_store() -> None:
    data_dir, instance = short_tmp(), new_instance("kb")
    process = PlaneProcess(data_dir, instance, pool_size=2)
    try:
        target = await process.start()
        store = SqliteStore(data_dir / "controlplane.db")
        async with AsyncClient(target, process.token()) as client:
            kept = await _kept_state(client, store)
            approvals = await store.load_approvals(kept.id)
            todos = await store.get_todos(kept.id)
            assert approvals
            assert todos
            burst = [asyncio.ensure_future(client.create_session(deadline_s=60)) for _ in range(BURST)]
            await asyncio.wait(burst, return_when=asyncio.FIRST_COMPLETED, timeout=60)
            in_flight = sum(not t.done() for t in burst)
            process.kill()
            outcomes = await asyncio.gather(*burst, return_exceptions=True)
        assert 0 < in_flight < BURST, "the kill did not land mid-burst"
        assert all(
            isinstance(o, session_pb2.Session) or (isinstance(o, grpc.aio.AioRpcError)
                                                   and o.code() == grpc.StatusCode.UNAVAILABLE)
            for o in outcomes
        ), outcomes

        restarted_at = time.monotonic()
        target = await process.start()
        reconciled_in = time.monotonic() - restarted_at
        assert reconciled_in <= RECONCILED_WITHIN_S
        async with AsyncClient(target, process.token()) as client:
            sessions = {s.id: s for s in await client.list_sessions()}
            states = {s.id: session_pb2.Session.State.Name(s.state) for s in sessions.values()}
            assert set(states.values()) <= {"READY", "FAILED"}, states
            assert sessions[kept.id].state == session_pb2.Session.READY
            assert (await client.run(kept.id, ["cat", "notes.txt"])).stdout == b"precious\n"
            assert await store.load_approvals(kept.id) == approvals
            assert await store.get_todos(kept.id) == todos
            again = await client.execute_tool(kept.id, "bash", {"command": "git status -s || true", "description": "S"})
            assert again.permission_requests == [], "the always-approval was lost"
            ready = {s.sandbox_id for s in sessions.values() if s.state == session_pb2.Session.READY}
            for s in sessions.values():
                if s.state == session_pb2.Session.READY:
                    assert (await client.run(s.id, ["echo", "up"])).stdout == b"up\n"
            # Everything of this instance is a READY session's or the warm pool's, on record in the store.
            pooled = await _settled_pool(store, instance)
            owned = ready | pooled
            assert {c.labels.get("ocsb.sandbox") for c in instance_containers(instance)} <= owned
            assert {(v.attrs.get("Labels") or {}).get("ocsb.sandbox") for v in instance_volumes(instance)} <= owned
            assert {p.name for p in (data_dir / "sandboxes").iterdir()} <= owned
            for session_id in sessions:
                await client.delete_session(session_id)
        await process.stop()
        store.close()
        assert instance_containers(instance) == []
        assert instance_volumes(instance) == []
        assert list((data_dir / "sandboxes").iterdir()) == []
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)
