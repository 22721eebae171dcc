"""Snapshots and forks through the public API on Docker sandboxes: what a restore brings back (files, modes,
symlinks, todos, approvals, config), that a fork is its own session, and the refusals: a corrupt snapshot, another
tenant's, a snapshot of a session that is gone."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.client_types import PermissionRequest
from controlplane.v1 import session_pb2, tool_pb2
from tests.archives import tar_of
from tests.plane_kills import killed_mid_snapshot
from tests.planes import (
    Plane,
    PlaneProcess,
    new_instance,
    remove_data_dir,
    remove_instance_leftovers,
    served_plane,
    short_tmp,
    tenant_clients,
)

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "snap-alpha"}, {"name": "beta", "token": "snap-beta"}]
plane = served_plane("docker", tenants=TENANTS, pool={"size": 1, "refill_concurrency": 1})
clients = tenant_clients(TENANTS)
CONFIG = {"permission": {"bash": {"*": "ask", "echo *": "allow"}}}
TODOS = [{"content": "Keep me ☂", "status": "in_progress", "priority": "high"}]
# Modes, an executable, an empty directory, relative and absolute symlinks, a dotfile: what a tar must carry.
SHAPE = ("cd /workspace && chmod 751 run.sh && chmod 600 secret.txt && mkdir -p empty/inner && chmod 705 empty && "
         "ln -s notes/readme.txt link && ln -s /etc/hostname abs-link && ln -s missing dangling && "
         "ln -s ../.. up-out && ln -s . self && ln -s self/self/self/../../.. chain-out && mkfifo pipe && "
         "echo v > .hidden")
UNPORTABLE = ("./abs-link 777 symbolic link\n/etc/hostname\n", "./up-out 777 symbolic link\n../..\n",
              "./chain-out 777 symbolic link\nself/self/self/../../..\n", "./pipe 644 fifo\n")
"""What no new session would take (a link out of the workspace, also one that leads out only through another
link, and a FIFO): left out of a snapshot and a fork."""
LOOK = ("cd /workspace && find . -path ./.opencode -prune -o -print | sort | "
        "while read f; do stat -c '%n %a %F' \"$f\"; [ -L \"$f\" ] && readlink \"$f\"; done; "
        "cat notes/readme.txt secret.txt .hidden")


class Answer:
    def __init__(self, reply: int) -> None:
        self.reply = reply
        self.asked: list[tuple[str, list[str]]] = []

    async def __call__(self, request: PermissionRequest) -> tuple[int, str]:
        self.asked.append((request.permission, list(request.patterns)))
        return self.reply, ""


async def _code(coro: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await coro
    return caught.value.code(), caught.value.details() or ""


async def _sh(client: AsyncClient, session: str, command: str) -> str:
    done = await client.run(session, command=command)
    assert done.exit_code == 0, done.stderr
    return done.stdout.decode()


async def _shaped_session(client: AsyncClient) -> str:
    files = {"notes/readme.txt": "hello\n", "run.sh": "#!/bin/sh\necho ran\n", "secret.txt": "s3\n"}
    session = await client.create_session(workspace_archive=tar_of(files), config_json=json.dumps(CONFIG),
                                          labels={"team": "a"}, agent="build")
    await _sh(client, session.id, SHAPE)
    return session.id


def _portable(look: str) -> str:
    for entry in UNPORTABLE:
        assert entry in look
        look = look.replace(entry, "")
    return look


def _stored(plane: Plane, tenant: str, snapshot_id: str) -> Any:
    settings = plane.plane.settings
    return settings.snapshots.root(settings.data_dir) / tenant / f"{snapshot_id}.tar.gz"


async def test_restore_keeps_files_modes_symlinks_todos_approvals_and_config(
    plane: Plane, clients: dict[str, AsyncClient]
) -> None:
    alpha = clients["alpha"]
    source = await _shaped_session(alpha)
    await alpha.execute_tool(source, "todowrite", {"todos": TODOS})
    always = Answer(tool_pb2.PermissionReply.ALWAYS)
    out = await alpha.execute_tool(source, "bash", {"command": "uname -s", "description": "Kernel"},
                                   on_permission=always)
    assert out.error is None
    assert always.asked == [("bash", ["uname -s"])]
    before = await _sh(alpha, source, LOOK)

    snap = await alpha.snapshot(source)
    assert (snap.session_id, snap.template) == (source, "default")
    assert snap.id.startswith("snap_")
    assert snap.size_bytes == _stored(plane, "alpha", snap.id).stat().st_size > 0
    assert [s.id for s in await alpha.list_snapshots()] == [snap.id]
    await _sh(alpha, source, "rm -rf /workspace/notes")  # the source goes on; the snapshot does not follow it

    restored = await alpha.create_session(from_snapshot=snap.id)
    assert restored.id != source
    assert (restored.agent, dict(restored.labels), restored.template) == ("build", {"team": "a"}, "default")
    assert restored.state == session_pb2.Session.READY
    assert await _sh(alpha, restored.id, LOOK) == _portable(before)
    assert "./link 777 symbolic link\nnotes/readme.txt\n" in before
    assert "./dangling 777 symbolic link\nmissing\n" in before
    assert "./empty 705 directory" in before
    assert "./run.sh 751 regular file" in before
    read = await alpha.execute_tool(restored.id, "todoread", {})
    assert json.loads(read.output) == TODOS
    # The "always" approval came along: `uname -a` runs unasked; the config's `ask` still asks for anything else.
    none = Answer(tool_pb2.PermissionReply.REJECT)
    out = await alpha.execute_tool(restored.id, "bash", {"command": "uname -a", "description": "K"},
                                   on_permission=none)
    assert (out.error, none.asked) == (None, [])
    out = await alpha.execute_tool(restored.id, "bash", {"command": "id -u", "description": "U"},
                                   on_permission=none)
    assert out.error is not None
    assert none.asked == [("bash", ["id -u"])]
    out = await alpha.execute_tool(restored.id, "bash", {"command": "echo allowed", "description": "E"},
                                   on_permission=none)
    assert out.error is None
    assert len(none.asked) == 1
    # Asking for anything the snapshot restores beside it is refused, not silently overridden.
    code, details = await _code(alpha.create_session(from_snapshot=snap.id, agent="plan"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "agent" in details
    deleted = await alpha.delete_snapshot(snap.id)
    assert deleted.id == snap.id
    assert await alpha.list_snapshots() == []
    assert not _stored(plane, "alpha", snap.id).exists()
    assert (await _code(alpha.delete_snapshot(snap.id)))[0] == grpc.StatusCode.NOT_FOUND


async def test_a_fork_is_independent_both_ways(plane: Plane, clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    source = await _shaped_session(alpha)
    await alpha.execute_tool(source, "todowrite", {"todos": TODOS})
    before = await _sh(alpha, source, LOOK)
    fork = await alpha.fork(source)
    assert fork.id != source
    assert fork.sandbox_id != (await alpha.get_session(source)).sandbox_id
    assert (fork.agent, dict(fork.labels)) == ("build", {"team": "a"})
    assert await _sh(alpha, fork.id, LOOK) == _portable(before)
    assert json.loads((await alpha.execute_tool(fork.id, "todoread", {})).output) == TODOS

    await _sh(alpha, fork.id, "echo fork > /workspace/from-fork && rm /workspace/secret.txt")
    await _sh(alpha, source, "echo source > /workspace/from-source")
    await alpha.execute_tool(fork.id, "todowrite", {"todos": []})
    assert await _sh(alpha, source, "ls /workspace/from-fork /workspace/secret.txt 2>&1 || true") == (
        "ls: cannot access '/workspace/from-fork': No such file or directory\n/workspace/secret.txt\n")
    assert "from-source" not in await _sh(alpha, fork.id, "ls -a /workspace")
    assert json.loads((await alpha.execute_tool(source, "todoread", {})).output) == TODOS
    await alpha.delete_session(source)
    assert await _sh(alpha, fork.id, "cat /workspace/from-fork") == "fork\n"


async def test_a_corrupt_snapshot_is_refused_and_creates_nothing(
    plane: Plane, clients: dict[str, AsyncClient]
) -> None:
    alpha = clients["alpha"]
    source = await _shaped_session(alpha)
    snap = await alpha.snapshot(source)
    stored = _stored(plane, "alpha", snap.id)
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x10
    stored.write_bytes(bytes(data))
    sessions = {s.id for s in await alpha.list_sessions(include_deleted=True)}
    code, details = await _code(alpha.create_session(from_snapshot=snap.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"snapshot {snap.id} is corrupt" in details
    assert {s.id for s in await alpha.list_sessions(include_deleted=True)} == sessions
    await alpha.delete_snapshot(snap.id)


async def test_another_tenant_can_neither_see_nor_restore_nor_take_one(
    plane: Plane, clients: dict[str, AsyncClient]
) -> None:
    alpha, beta = clients["alpha"], clients["beta"]
    source = await _shaped_session(alpha)
    snap = await alpha.snapshot(source)
    assert await beta.list_snapshots() == []
    assert (await _code(beta.create_session(from_snapshot=snap.id)))[0] == grpc.StatusCode.NOT_FOUND
    assert (await _code(beta.delete_snapshot(snap.id)))[0] == grpc.StatusCode.NOT_FOUND
    assert (await _code(beta.snapshot(source)))[0] == grpc.StatusCode.NOT_FOUND
    assert (await _code(beta.fork(source)))[0] == grpc.StatusCode.NOT_FOUND
    assert await beta.list_sessions() == []
    assert (await _code(beta.create_session(from_snapshot="../alpha/" + snap.id)))[0] \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert [s.id for s in await alpha.list_snapshots()] == [snap.id]
    await alpha.delete_snapshot(snap.id)


async def test_a_snapshot_or_fork_of_a_session_that_is_gone_fails_cleanly(
    plane: Plane, clients: dict[str, AsyncClient]
) -> None:
    alpha = clients["alpha"]
    session = await alpha.create_session()
    await alpha.delete_session(session.id)
    code, details = await _code(alpha.snapshot(session.id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"session {session.id} is DELETED" in details
    assert (await _code(alpha.fork(session.id)))[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert (await _code(alpha.snapshot("ses_" + "0" * 24)))[0] == grpc.StatusCode.NOT_FOUND
    assert await alpha.list_snapshots() == []
    folder = _stored(plane, "alpha", "snap_" + "0" * 24).parent
    assert not folder.exists() or list(folder.iterdir()) == []


async def test_a_plane_killed_while_writing_a_snapshot_leaves_none() -> None:
    data_dir, instance = short_tmp(), new_instance("sn")
    process = PlaneProcess(data_dir, instance, pool_size=0)
    try:
        await killed_mid_snapshot(process, 80_000_000)
    finally:
        await process.stop()
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)

async def test_set_id_and_sticky_bits_survive_a_restore(clients: dict[str, AsyncClient]) -> None:
    alpha = clients["alpha"]
    source = (await alpha.create_session()).id
    shape = "cd /workspace && mkdir shared group && chmod 3777 shared && chmod 2750 group && " \
            "echo t > group/tool && chmod 6755 group/tool"
    look = "cd /workspace && stat -c '%a %n' shared group group/tool && cat group/tool"
    await _sh(alpha, source, shape)
    before = await _sh(alpha, source, look)
    assert before == "3777 shared\n2750 group\n6755 group/tool\nt\n"
    snap = await alpha.snapshot(source)
    restored = (await alpha.create_session(from_snapshot=snap.id)).id
    assert await _sh(alpha, restored, look) == before
    for session_id in (source, restored):
        await alpha.delete_session(session_id)
    await alpha.delete_snapshot(snap.id)
