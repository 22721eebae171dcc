"""Pause and resume on the two-node swarm: the workspace travels through the plane's snapshot storage, so a
session resumes on whichever node Swarm places its new sandbox (here the node its tenant is constrained to). An
idle session that expires on either node leaves its workspace and todos as a retained snapshot that restores."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import docker
import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.cluster.support import TOKENS, Cluster, SwarmPlane, swarm_plane
from tests.docker.custom_tools_support import ECHO_TS, custom_tools

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def _tasks(plane: SwarmPlane, sandbox_id: str) -> list[Any]:
    api: Any = docker.from_env().api
    try:
        return list(api.tasks(filters={"service": f"ocsb-{plane.instance}-{sandbox_id}", "desired-state": "running"}))
    except docker.errors.NotFound:  # the service itself is gone
        return []


async def test_pause_and_resume_on_each_node(cluster: Cluster, plane: SwarmPlane) -> None:
    for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
        client = plane.clients[tenant]
        session = await client.create_session(workspace_archive=tar_of({"work.txt": f"{tenant}\n"}))
        done = await client.run(session.id, command="echo more >> /workspace/work.txt")
        assert done.exit_code == 0, done.stderr
        paused = await client.pause(session.id)
        assert paused.state == session_pb2.Session.PAUSED
        assert _tasks(plane, session.sandbox_id) == []
        resumed = await client.resume(session.id)
        assert resumed.state == session_pb2.Session.READY
        assert resumed.sandbox_id != session.sandbox_id
        [task] = _tasks(plane, resumed.sandbox_id)
        assert task["NodeID"] == node
        done = await client.run(session.id, command="cat /workspace/work.txt")
        assert done.stdout == f"{tenant}\nmore\n".encode()
        await client.delete_session(session.id)


IDLE_S = 10
TODOS = [{"content": "Outlive the task", "status": "in_progress", "priority": "high"}]
SHAPE = ("cd /workspace && echo more >> work.txt && chmod 640 work.txt && mkdir -p bin && "
         "printf '#!/bin/sh\\necho ran\\n' > bin/run.sh && chmod 750 bin/run.sh && ln -s work.txt link")
LOOK = ("cd /workspace && cat work.txt link && stat -c '%n %a %F' work.txt bin/run.sh link && readlink link && "
        "sh bin/run.sh")


async def _sh(client: AsyncClient, session_id: str, command: str) -> str:
    done = await client.run(session_id, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def test_an_expired_session_on_each_node_leaves_a_retained_snapshot_that_restores(cluster: Cluster) -> None:
    lifetime = {"idle_timeout_s": IDLE_S, "reap_interval_s": 0.5, "retain_s": 3600}
    async with swarm_plane(settings={"lifetime": lifetime}) as plane:
        for tenant, node in (("alpha", cluster.manager), ("beta", cluster.worker)):
            client = plane.clients[tenant]
            session = await client.create_session(workspace_archive=tar_of({"work.txt": f"{tenant}\n"}))
            await _sh(client, session.id, SHAPE)
            await client.execute_tool(session.id, "todowrite", {"todos": TODOS})
            before = await _sh(client, session.id, LOOK)
            assert before.startswith(f"{tenant}\nmore\n{tenant}\nmore\n")
            assert await client.list_snapshots() == []

            deadline = time.monotonic() + IDLE_S + 60
            while (await client.get_session(session.id)).state != session_pb2.Session.DELETED:
                assert time.monotonic() < deadline, f"{tenant}'s idle session did not expire"
                await asyncio.sleep(0.5)
            assert (await client.get_session(session.id)).status_message.startswith("expired: idle")
            assert _tasks(plane, session.sandbox_id) == []  # the task went, on whichever node it ran
            [kept] = await client.list_snapshots()
            assert (kept.session_id, kept.retained) == (session.id, True)
            assert 3500 < kept.purge_at.seconds - time.time() <= 3600

            restored = await client.create_session(from_snapshot=kept.id)
            assert restored.state == session_pb2.Session.READY
            [task] = _tasks(plane, restored.sandbox_id)
            assert task["NodeID"] == node
            assert await _sh(client, restored.id, LOOK) == before
            assert await client.read_file(restored.id, "work.txt") == f"{tenant}\nmore\n".encode()  # files API
            assert json.loads((await client.execute_tool(restored.id, "todoread", {})).output) == TODOS
            await client.delete_session(restored.id)
            await client.delete_snapshot(kept.id)
            assert await client.list_snapshots() == []


async def test_pause_frees_the_quota_and_resume_brings_back_the_custom_tools_and_todos(cluster: Cluster) -> None:
    # One default session (1 CPU) fills gamma's CPU quota; gamma is placed on either node.
    del cluster
    settings = {"tenants": [{"name": n, "token": t, **({"quota": {"cpu": 1}} if n == "gamma" else {})}
                            for n, t in TOKENS.items()]}
    async with swarm_plane(settings=settings) as plane:
        gamma = plane.clients["gamma"]
        files = {"notes.txt": "before the pause\n", ".opencode/tool/echo.ts": ECHO_TS}
        session = await gamma.create_session(workspace_archive=tar_of(files))
        await gamma.execute_tool(session.id, "todowrite", {"todos": TODOS})
        assert "echo" in custom_tools(await gamma.list_tools(session.id))
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await gamma.create_session()
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # gamma's one CPU is taken

        await gamma.pause(session.id)
        assert _tasks(plane, session.sandbox_id) == []
        other = await gamma.create_session()  # its CPU is free while it is paused
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gamma.resume(session.id)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await gamma.delete_session(other.id)

        resumed = await gamma.resume(session.id)
        assert resumed.state == session_pb2.Session.READY
        assert await _sh(gamma, session.id, "cat /workspace/notes.txt") == "before the pause\n"
        assert "echo" in custom_tools(await gamma.list_tools(session.id))
        echoed = await gamma.execute_tool(session.id, "echo", {"text": "again"})
        assert echoed.result is not None, echoed.error
        assert echoed.result.output == "echo: again"
        assert json.loads((await gamma.execute_tool(session.id, "todoread", {})).output) == TODOS
