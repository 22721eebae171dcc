"""Two control planes on one PostgreSQL database serve the same tenants and sessions.

Each plane has its own instance name (it creates, reconciles and removes only its own sandboxes) and reaches
the other's sandboxes through `SandboxProvider.attach`: the local provider through the shared data dir, the
Docker provider through the container's own agent-dir mount.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from controlplane import app
from controlplane.client import AsyncClient, PermissionRequest
from controlplane.config import load_settings
from controlplane.sandbox.docker import DockerSandboxProvider
from controlplane.v1 import session_pb2, tool_pb2
from tests.planes import Plane, new_instance, remove_data_dir, remove_instance_leftovers, short_tmp
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.postgres

TOKEN = "token-acme"
TENANTS = [{"name": "acme", "token": TOKEN}, {"name": "beta", "token": "token-beta"}]
ASK_GIT = json.dumps({"permission": {"bash": {"*": "allow", "git *": "ask"}}})
TODOS = [
    {"content": "Write the migration", "status": "completed", "priority": "high"},
    {"content": "Vérifier les deux plans", "status": "in_progress", "priority": "medium"},
]


@asynccontextmanager
async def plane_on(url: str, data_dir: Path, provider: str, **overrides: Any) -> AsyncIterator[Plane]:
    instance = new_instance("pg")
    chosen: dict[str, Any] = {"type": provider}
    if provider == "docker" and os.environ.get("OCSB_TEST_IMAGE"):
        chosen["image"] = os.environ["OCSB_TEST_IMAGE"]  # as tests/planes.py: a checkout's own image
    settings = load_settings(
        None, data_dir=data_dir, instance=instance, provider=chosen, server={"listen": "127.0.0.1:0"},
        tenants=TENANTS, store={"url": url, "pool_size": 4}, pool={"size": 0}, **overrides,
    )
    plane = await app.start(settings)
    client = AsyncClient(plane.address, TOKEN)
    try:
        yield Plane(plane, client, TOKEN)
    finally:
        await client.close()
        await app.stop(plane)
        if provider == "docker":
            remove_instance_leftovers(instance)


def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "Runs a command"}


class Asks:
    """Answers permission requests with `reply`, remembering what was asked."""

    def __init__(self, reply: int = tool_pb2.PermissionReply.ONCE) -> None:
        self.reply = reply
        self.asked: list[list[str]] = []

    async def __call__(self, request: PermissionRequest) -> tuple[int, str]:
        self.asked.append(list(request.patterns))
        return self.reply, ""


async def test_local_planes_share_sessions_approvals_and_todos(pg_url: str) -> None:
    data_dir = short_tmp()
    try:
        async with plane_on(pg_url, data_dir, "local") as a:
            created = await a.client.create_session(config_json=ASK_GIT, labels={"who": "a"})
            # B starts while A holds a live session: it must neither adopt nor fail it.
            async with plane_on(pg_url, data_dir, "local") as b:
                await _shared_session_works_on_both(a, b, created)
                await _approvals_and_todos_are_consistent(a, b, created.id)
                await _deleting_through_b_ends_it_on_a(a, b, created.id, data_dir)
    finally:
        remove_data_dir(data_dir)


async def _shared_session_works_on_both(a: Plane, b: Plane, created: session_pb2.Session) -> None:
    seen = await b.client.get_session(created.id)
    assert (seen.id, seen.state, seen.sandbox_id, dict(seen.labels)) == (
        created.id, session_pb2.Session.READY, created.sandbox_id, {"who": "a"},
    )
    assert [s.id for s in await b.client.list_sessions()] == [created.id]
    async with AsyncClient(b.plane.address, "token-beta") as stranger:  # tenants stay apart on B too
        assert await stranger.list_sessions() == []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stranger.execute_tool(created.id, "bash", bash("true"))
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.NOT_FOUND, f"session {created.id!r} not found",
        )
    written = await b.client.execute_tool(created.id, "bash", bash("echo from-b > note.txt && cat note.txt"))
    assert written.output == "from-b\n"
    read_back = await a.client.execute_tool(created.id, "bash", bash("cat note.txt"))
    assert read_back.output == "from-b\n"  # one sandbox, reached from both planes


async def _approvals_and_todos_are_consistent(a: Plane, b: Plane, session_id: str) -> None:
    first_on_b = Asks()  # loads B's approvals for the session (empty) into its permission gate
    assert (await b.client.execute_tool(session_id, "bash", bash("git --version"), on_permission=first_on_b)).result
    assert first_on_b.asked == [["git --version"]]
    always_on_a = Asks(tool_pb2.PermissionReply.ALWAYS)
    assert (await a.client.execute_tool(session_id, "bash", bash("git --version"), on_permission=always_on_a)).result
    assert always_on_a.asked == [["git --version"]]
    again_on_b = Asks()
    outcome = await b.client.execute_tool(session_id, "bash", bash("git --version"), on_permission=again_on_b)
    assert outcome.result is not None
    assert (again_on_b.asked, outcome.permission_requests) == ([], [])
    assert (await b.client.execute_tool(session_id, "bash", bash("git status"), on_permission=again_on_b)).result
    assert again_on_b.asked == [["git status"]]  # only what was approved is allowed

    written = await a.client.execute_tool(session_id, "todowrite", {"todos": TODOS})
    read = await b.client.execute_tool(session_id, "todoread", {})
    assert json.loads(read.output) == TODOS
    assert (read.output, read.result.title if read.result else "") == (written.output, "1 todos")
    await b.client.execute_tool(session_id, "todowrite", {"todos": TODOS[:1]})
    assert json.loads((await a.client.execute_tool(session_id, "todoread", {})).output) == TODOS[:1]


async def _deleting_through_b_ends_it_on_a(a: Plane, b: Plane, session_id: str, data_dir: Path) -> None:
    sandbox_id = (await a.client.get_session(session_id)).sandbox_id
    deleted = await b.client.delete_session(session_id)
    assert deleted.state == session_pb2.Session.DELETED
    assert (data_dir / "sandboxes" / sandbox_id / "agent.sock").exists()  # B never removes A's sandbox
    await a.plane.sessions.reap_expired()  # A's reaper takes in what B did (every reap_interval_s)
    assert not (data_dir / "sandboxes" / sandbox_id).exists()
    assert (await a.client.get_session(session_id)).state == session_pb2.Session.DELETED
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await a.client.execute_tool(session_id, "bash", bash("true"))
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION, f"session {session_id} is DELETED (deleted)",
    )
    assert (await b.client.delete_session(session_id)).state == session_pb2.Session.DELETED  # idempotent


async def test_activity_through_b_postpones_the_idle_timeout_on_a(pg_url: str) -> None:
    data_dir = short_tmp()
    idle = {"idle_timeout_s": 2.0, "reap_interval_s": 3600.0}
    try:
        async with plane_on(pg_url, data_dir, "local", lifetime=idle) as a, \
                plane_on(pg_url, data_dir, "local", lifetime=idle) as b:
            created = await a.client.create_session()
            started = time.monotonic()
            await asyncio.sleep(1.2)
            assert (await b.client.execute_tool(created.id, "bash", bash("echo busy"))).output == "busy\n"
            await asyncio.sleep(max(0.0, started + 2.4 - time.monotonic()))
            assert await a.plane.sessions.reap_expired() == []  # idle 2.4 s on A, but used through B 1.2 s ago
            await asyncio.sleep(max(0.0, started + 3.5 - time.monotonic()))
            assert await a.plane.sessions.reap_expired() == [created.id]
            ended = await b.client.get_session(created.id)
            assert (ended.state, ended.status_message) == (session_pb2.Session.DELETED, "expired: idle for 2 s")
    finally:
        remove_data_dir(data_dir)


@pytest.mark.docker
async def test_docker_planes_with_their_own_data_dirs_share_a_session(pg_url: str) -> None:
    dir_a, dir_b = short_tmp(), short_tmp()
    try:
        async with plane_on(pg_url, dir_a, "docker") as a, plane_on(pg_url, dir_b, "docker") as b:
            created = await a.client.create_session()
            ran = await b.client.execute_tool(created.id, "bash", bash("id -u; echo hi > /workspace/x; cat x"))
            assert ran.output == f"{tool_uid(a.instance, created.sandbox_id)}\nhi\n"
            await b.client.execute_tool(created.id, "todowrite", {"todos": TODOS})
            assert json.loads((await a.client.execute_tool(created.id, "todoread", {})).output) == TODOS
            assert (await b.client.delete_session(created.id)).state == session_pb2.Session.DELETED
            container = f"ocsb-{a.instance}-{created.sandbox_id}"
            assert _container_exists(container)  # B leaves A's container to A
            await a.plane.sessions.reap_expired()
            assert not _container_exists(container)
            # B's channel to the removed sandbox goes when B next attaches one: they do not pile up.
            provider = b.plane.sessions._provider
            assert isinstance(provider, DockerSandboxProvider)
            attached = provider._attached
            assert created.sandbox_id in attached
            second = await a.client.create_session()
            assert (await b.client.execute_tool(second.id, "bash", bash("echo again"))).output == "again\n"
            assert set(attached) == {second.sandbox_id}
            await a.client.delete_session(second.id)
    finally:
        shutil.rmtree(dir_a, ignore_errors=True)
        shutil.rmtree(dir_b, ignore_errors=True)


def _container_exists(name: str) -> bool:
    import docker
    import docker.errors

    client = docker.from_env()
    try:
        client.containers.get(name)
    except docker.errors.NotFound:
        return False
    finally:
        client.close()
    return True
