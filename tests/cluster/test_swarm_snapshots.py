"""Snapshots and forks on the two-node swarm, through the public API: the workspace tar crosses the relay both
ways (Download from the source's agent, Upload into the new one), a snapshot taken of a sandbox on the worker
restores on the manager through another control plane that shares the store and the snapshot directory, and a
fork on the worker is independent both ways."""

from __future__ import annotations

import json
import shutil
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.client_types import PermissionRequest
from controlplane.sandbox.swarm.provider import SwarmSandboxProvider
from controlplane.v1 import session_pb2, tool_pb2
from tests.archives import tar_of
from tests.cluster.support import TENANT_CONSTRAINTS, Cluster, swarm_plane
from tests.planes import short_tmp

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

TODOS = [{"content": "Across nodes", "status": "in_progress", "priority": "high"}]
CONFIG = {"permission": {"bash": {"*": "ask", "echo *": "allow"}}}
SHAPE = ("cd /workspace && chmod 751 run.sh && chmod 600 secret.txt && mkdir -p empty && chmod 705 empty && "
         "ln -s notes/readme.txt link && ln -s missing dangling && echo v > .hidden && "
         "head -c 3000000 /dev/urandom > noise.bin")
LOOK = ("cd /workspace && find . -path ./.opencode -prune -o -print | sort | "
        "while read f; do stat -c '%n %a %F %s' \"$f\"; [ -L \"$f\" ] && readlink \"$f\"; done; "
        "cat notes/readme.txt secret.txt .hidden; sha256sum noise.bin")


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def _shaped(client: AsyncClient) -> str:
    files = {"notes/readme.txt": "hello\n", "run.sh": "#!/bin/sh\necho ran\n", "secret.txt": "s3\n"}
    session = await client.create_session(workspace_archive=tar_of(files), labels={"team": "s"},
                                          config_json=json.dumps(CONFIG))
    await _sh(client, session.id, SHAPE)
    await client.execute_tool(session.id, "todowrite", {"todos": TODOS})
    always = Answer(tool_pb2.PermissionReply.ALWAYS)
    out = await client.execute_tool(session.id, "bash", {"command": "uname -s", "description": "Kernel"},
                                    on_permission=always)
    assert out.error is None
    assert always.asked == [["uname -s"]]
    return session.id


class Answer:
    def __init__(self, reply: int) -> None:
        self.reply = reply
        self.asked: list[list[str]] = []

    async def __call__(self, request: PermissionRequest) -> tuple[int, str]:
        self.asked.append(list(request.patterns))
        return self.reply, ""


def _node(plane: Any, sandbox_id: str) -> str:
    provider = plane.plane.sessions._provider
    assert isinstance(provider, SwarmSandboxProvider)
    return provider.node_of(sandbox_id)


async def test_a_snapshot_from_the_worker_restores_on_the_manager_through_another_plane(cluster: Cluster) -> None:
    shared_dir = short_tmp()
    shared = {"store": {"url": f"sqlite:///{shared_dir}/shared.db"},
              "snapshots": {"path": str(shared_dir / "snapshots")}}
    try:
        async with swarm_plane(settings=shared) as a:
            beta = a.clients["beta"]  # placed on the worker
            source = await _shaped(beta)
            assert _node(a, (await beta.get_session(source)).sandbox_id) == cluster.worker
            before = await _sh(beta, source, LOOK)
            snap = await beta.snapshot(source)
            assert (snap.session_id, snap.template) == (source, "default")
            assert snap.size_bytes > 3_000_000  # random bytes do not compress

            # Plane b places beta on the manager: the snapshot crosses nodes through the shared directory.
            moved = {**TENANT_CONSTRAINTS, "beta": ["node.labels.ocsb.node==manager"]}
            async with swarm_plane(settings=shared, delete_sessions=False, tenant_constraints=moved) as b:
                assert [s.id for s in await b.clients["beta"].list_snapshots()] == [snap.id]
                restored = await b.clients["beta"].create_session(from_snapshot=snap.id)
                assert restored.state == session_pb2.Session.READY
                assert _node(b, restored.sandbox_id) == cluster.manager
                assert dict(restored.labels) == {"team": "s"}
                assert await _sh(b.clients["beta"], restored.id, LOOK) == before
                todos = await b.clients["beta"].execute_tool(restored.id, "todoread", {})
                assert json.loads(todos.output) == TODOS
                # The config and the "always" approval came along: `uname -a` runs unasked, `id -u` asks.
                none = Answer(tool_pb2.PermissionReply.REJECT)
                out = await b.clients["beta"].execute_tool(
                    restored.id, "bash", {"command": "uname -a", "description": "K"}, on_permission=none)
                assert (out.error, none.asked) == (None, [])
                out = await b.clients["beta"].execute_tool(
                    restored.id, "bash", {"command": "id -u", "description": "U"}, on_permission=none)
                assert out.error is not None
                assert none.asked == [["id -u"]]
                # Another tenant neither sees nor restores it, on this plane either.
                assert await b.clients["gamma"].list_snapshots() == []
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await b.clients["gamma"].create_session(from_snapshot=snap.id)
                assert refused.value.code() == grpc.StatusCode.NOT_FOUND
                await b.clients["beta"].delete_session(restored.id)
            await beta.delete_snapshot(snap.id)
            assert await beta.list_snapshots() == []
    finally:
        shutil.rmtree(shared_dir, ignore_errors=True)


async def test_a_fork_on_the_worker_is_independent_both_ways(cluster: Cluster) -> None:
    async with swarm_plane() as p:
        beta = p.clients["beta"]
        source = await _shaped(beta)
        before = await _sh(beta, source, LOOK)
        fork = await beta.fork(source)
        assert fork.id != source
        assert fork.sandbox_id != (await beta.get_session(source)).sandbox_id
        assert _node(p, fork.sandbox_id) == cluster.worker
        assert await _sh(beta, fork.id, LOOK) == before
        assert json.loads((await beta.execute_tool(fork.id, "todoread", {})).output) == TODOS

        await _sh(beta, fork.id, "echo fork > /workspace/from-fork && rm /workspace/secret.txt")
        await _sh(beta, source, "echo source > /workspace/from-source")
        await beta.execute_tool(fork.id, "todowrite", {"todos": []})
        assert await _sh(beta, source, "ls /workspace/from-fork /workspace/secret.txt 2>&1 || true") == (
            "ls: cannot access '/workspace/from-fork': No such file or directory\n/workspace/secret.txt\n")
        assert "from-source" not in await _sh(beta, fork.id, "ls -a /workspace")
        assert json.loads((await beta.execute_tool(source, "todoread", {})).output) == TODOS
        await beta.delete_session(source)
        assert await _sh(beta, fork.id, "cat /workspace/from-fork") == "fork\n"


async def test_a_corrupt_snapshot_is_refused_on_the_swarm_and_creates_nothing(cluster: Cluster) -> None:
    async with swarm_plane() as p:
        gamma = p.clients["gamma"]
        source = await _shaped(gamma)
        snap = await gamma.snapshot(source)
        settings = p.plane.settings
        stored = settings.snapshots.root(settings.data_dir) / "gamma" / f"{snap.id}.tar.gz"
        data = bytearray(stored.read_bytes())
        data[len(data) // 2] ^= 0x10
        stored.write_bytes(bytes(data))
        sessions = {s.id for s in await gamma.list_sessions(include_deleted=True)}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gamma.create_session(from_snapshot=snap.id)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"snapshot {snap.id} is corrupt" in (refused.value.details() or "")
        assert {s.id for s in await gamma.list_sessions(include_deleted=True)} == sessions
        await gamma.delete_snapshot(snap.id)
