"""Pause and resume through the public API on Docker sandboxes: a pause removes the container and gives the
session's CPU and memory back to the tenant's quota, every call on a paused session is refused with what to do,
a resume brings back the workspace, the custom tools and the todos on a fresh container, and a plane killed with
a paused session serves it again after a restart."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2, tool_pb2
from tests.archives import tar_of
from tests.docker.custom_tools_support import ECHO_TS, custom_tools
from tests.plane_kills import killed_mid_resume
from tests.planes import (
    Plane,
    PlaneProcess,
    instance_containers,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    served_plane,
    short_tmp,
    tenant_clients,
)

pytestmark = pytest.mark.docker

# One default session (1 CPU, 1024 MiB) fills alpha's CPU quota; beta has none.
TENANTS: list[dict[str, Any]] = [{"name": "alpha", "token": "pause-alpha", "quota": {"cpu": 1}},
           {"name": "beta", "token": "pause-beta"}]
plane = served_plane("docker", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)
TODOS = [{"content": "Finish after the pause", "status": "in_progress", "priority": "high"}]
FILES = {"notes.txt": "before the pause\n", ".opencode/tool/echo.ts": ECHO_TS}


async def _code(coro: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coro
    return caught.value.code(), caught.value.details() or ""


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


def _containers_of(instance: str, sandbox_id: str) -> list[Any]:
    return [c for c in instance_containers(instance) if c.labels.get("ocsb.sandbox") == sandbox_id]


async def test_pause_frees_the_container_and_the_quota_and_resume_brings_everything_back(
    plane: Plane, clients: dict[str, AsyncClient]
) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session(workspace_archive=tar_of(FILES))
    await _sh(alpha, session.id, "echo written-in-the-sandbox > /workspace/made.txt && chmod 640 /workspace/made.txt")
    await alpha.execute_tool(session.id, "todowrite", {"todos": TODOS})
    assert "echo" in custom_tools(await alpha.list_tools(session.id))
    code, details = await _code(alpha.create_session())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details  # alpha's one CPU is taken

    paused = await alpha.pause(session.id)
    assert paused.state == session_pb2.Session.PAUSED
    assert paused.sandbox_id == ""
    assert not _containers_of(plane.instance, session.sandbox_id)
    assert (await alpha.get_session(session.id)).state == session_pb2.Session.PAUSED
    assert session.id not in {s.session_id for s in await alpha.list_snapshots()}  # its own, not a snapshot

    # Every way in is refused, saying what to do.
    refusals = [
        _code(alpha.run(session.id, command="true")),
        _code(alpha.read_file(session.id, "notes.txt")),
        _code(alpha.list_tools(session.id)),
        _code(alpha.snapshot(session.id)),
        _code(alpha.fork(session.id)),
    ]
    for code, details in await asyncio.gather(*refusals):
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert "PAUSED" in details or "paused" in details, details
    code, details = await _code(alpha.run(session.id, command="true"))
    assert "ResumeSession" in details, details
    code, details = await _code(alpha.execute_tool(session.id, "read", {"filePath": "notes.txt"}))
    assert code == grpc.StatusCode.FAILED_PRECONDITION, details
    assert "ResumeSession" in details, details

    # Its CPU is free: another session fits now, and while that one holds it the resume is refused.
    other = await alpha.create_session()
    code, details = await _code(alpha.resume(session.id))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    assert (await alpha.get_session(session.id)).state == session_pb2.Session.PAUSED
    await alpha.delete_session(other.id)

    resumed = await alpha.resume(session.id)
    assert resumed.state == session_pb2.Session.READY
    assert resumed.id == session.id
    assert resumed.sandbox_id
    assert resumed.sandbox_id != session.sandbox_id
    out = await _sh(alpha, session.id, "cat /workspace/notes.txt /workspace/made.txt; stat -c %a /workspace/made.txt")
    assert out == "before the pause\nwritten-in-the-sandbox\n640\n"
    assert "echo" in custom_tools(await alpha.list_tools(session.id))
    echoed = await alpha.execute_tool(session.id, "echo", {"text": "again"})
    assert echoed.result is not None, echoed.error
    assert echoed.result.output == "echo: again"
    assert json.loads((await alpha.execute_tool(session.id, "todoread", {})).output) == TODOS
    assert (await alpha.resume(session.id)).state == session_pb2.Session.READY  # resuming a running one: no-op
    code, details = await _code(alpha.create_session())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details  # counted again


async def test_the_bus_says_paused_and_resumed_with_the_code_a_resume_loaded(clients: dict[str, AsyncClient]) -> None:
    beta = clients["beta"]
    session = await beta.create_session(workspace_archive=tar_of(FILES))
    subscription = beta.subscribe_events(session.id)
    seen: list[tuple[str, dict[str, Any]]] = []

    async def collect() -> None:
        async for event in subscription:
            seen.append((event.type, json.loads(event.properties_json)))
            if event.type == "session.resumed":
                return

    collector = asyncio.ensure_future(collect())
    await asyncio.sleep(0.1)
    await beta.pause(session.id)
    await beta.resume(session.id)
    await asyncio.wait_for(collector, 30)
    kinds = [kind for kind, _ in seen]
    assert kinds.index("session.paused") < kinds.index("session.resumed")
    resumed = seen[-1][1]
    assert resumed["sandboxID"] == (await beta.get_session(session.id)).sandbox_id
    assert any(path.endswith(".opencode/tool/echo.ts") for path in resumed["codeLoaded"]), resumed


async def test_another_tenant_can_neither_pause_nor_resume(clients: dict[str, AsyncClient]) -> None:
    alpha, beta = clients["alpha"], clients["beta"]
    session = await alpha.create_session()
    code, _ = await _code(beta.pause(session.id))
    assert code == grpc.StatusCode.NOT_FOUND
    await alpha.pause(session.id)
    code, _ = await _code(beta.resume(session.id))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await _code(beta.delete_session(session.id))
    assert code == grpc.StatusCode.NOT_FOUND
    assert (await alpha.get_session(session.id)).state == session_pb2.Session.PAUSED


async def test_deleting_a_paused_session_removes_its_stored_workspace(
    plane: Plane, clients: dict[str, AsyncClient]
) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session(workspace_archive=tar_of({"a.txt": "a\n"}))
    await alpha.pause(session.id)
    root = plane.plane.settings.snapshots.root(plane.plane.settings.data_dir)
    assert any(session.id in p.read_text() for p in root.rglob("snap_*.json"))
    deleted = await alpha.delete_session(session.id)
    assert deleted.state == session_pb2.Session.DELETED
    assert not any(session.id in p.read_text() for p in root.rglob("snap_*.json"))
    code, _ = await _code(alpha.resume(session.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


idle = served_plane("docker", name="idle_plane", scope="function", pool={"size": 0},
                    lifetime={"pause_after_idle_s": 2, "idle_timeout_s": 600, "reap_interval_s": 0.5})


async def test_an_idle_session_is_paused_instead_of_deleted(idle_plane: Plane) -> None:
    client = idle_plane.client
    session = await client.create_session(workspace_archive=tar_of({"kept.txt": "kept\n"}))
    deadline = time.monotonic() + 30
    while (await client.get_session(session.id)).state != session_pb2.Session.PAUSED:
        assert time.monotonic() < deadline, "the idle session was not paused"
        await asyncio.sleep(0.5)
    assert not _containers_of(idle_plane.instance, session.sandbox_id)
    await client.resume(session.id)
    assert await _sh(client, session.id, "cat /workspace/kept.txt") == "kept\n"


async def test_a_paused_session_survives_a_killed_plane() -> None:
    data_dir, instance = short_tmp(), new_instance("pr")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    try:
        client = AsyncClient(await process.start(), process.token())
        session = await client.create_session(workspace_archive=tar_of({"work.txt": "mine\n"}))
        await client.pause(session.id)
        await client.close()
        process.kill()
        client = AsyncClient(await process.start(), process.token())
        again = await client.get_session(session.id)
        assert again.state == session_pb2.Session.PAUSED
        assert not [c for c in instance_containers(instance) if c.labels.get("ocsb.session") == session.id]
        await client.resume(session.id)
        assert await _sh(client, session.id, "cat /workspace/work.txt") == "mine\n"
        await client.delete_session(session.id)
        await client.close()
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_keep_snapshot_is_refused_where_nothing_is_retained(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    code, details = await _code(alpha.delete_keeping(session.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION, details
    assert "lifetime.retain_s = 0" in details
    assert (await alpha.get_session(session.id)).state == session_pb2.Session.READY  # nothing deleted


async def test_a_plane_killed_mid_resume_leaves_no_container_and_the_session_resumable() -> None:
    data_dir, instance = short_tmp(), new_instance("pk")
    process = PlaneProcess(data_dir, instance, pool_size=0)  # no pool: the resume creates a container of its own

    def claimed(session_id: str) -> list[object]:
        return [c for c in instance_containers(instance) if c.labels.get("ocsb.session") == session_id]

    try:
        await killed_mid_resume(process, claimed)
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def test_a_resumed_session_keeps_its_config_and_always_approvals(clients: dict[str, AsyncClient]) -> None:
    beta = clients["beta"]
    config = {"permission": {"bash": {"*": "ask", "echo *": "allow"}}}
    session = await beta.create_session(config_json=json.dumps(config))
    asked: list[list[str]] = []

    def answering(reply: int) -> Any:
        async def answer(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
            asked.append(list(request.patterns))
            return reply, ""
        return answer

    out = await beta.execute_tool(session.id, "bash", {"command": "uname -s", "description": "K"},
                                  on_permission=answering(tool_pb2.PermissionReply.ALWAYS))
    assert out.error is None
    assert asked == [["uname -s"]]
    await beta.pause(session.id)
    await beta.resume(session.id)
    reject = answering(tool_pb2.PermissionReply.REJECT)
    out = await beta.execute_tool(session.id, "bash", {"command": "uname -a", "description": "K"},
                                  on_permission=reject)
    assert out.error is None  # the "always" approval held across the pause
    assert asked == [["uname -s"]]
    out = await beta.execute_tool(session.id, "bash", {"command": "id -u", "description": "U"}, on_permission=reject)
    assert out.error is not None  # and the config's `ask` still asks
    assert asked == [["uname -s"], ["id -u"]]
    out = await beta.execute_tool(session.id, "bash", {"command": "echo ok", "description": "E"}, on_permission=reject)
    assert out.error is None
