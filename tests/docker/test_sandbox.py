"""The foundation's proofs against real containers, through the real gRPC API."""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
import time
from typing import Any

import docker
import grpc
import pytest
from docker.models.containers import Container

from controlplane.sandbox.docker import DockerSandboxProvider
from controlplane.v1 import session_pb2
from tests.planes import Plane, instance_containers, instance_volumes

pytestmark = pytest.mark.docker


def container_of(plane: Plane, sandbox_id: str) -> Container:
    return docker.from_env().containers.get(f"ocsb-{plane.instance}-{sandbox_id}")


async def test_session_is_ready_and_tools_run_as_the_tool_uid(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    assert session.state == session_pb2.Session.READY
    done = await docker_plane.client.run(session.id, ["id", "-u"])
    tool_uid = int(done.stdout)
    assert tool_uid not in (0,)
    agent_uid = int((await docker_plane.client.run(session.id, ["stat", "-c", "%u", "/proc/1"])).stdout)
    assert tool_uid != agent_uid
    status = (await docker_plane.client.run(session.id, ["cat", "/proc/self/status"])).stdout.decode()
    facts = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert facts["CapEff"].strip() == "0000000000000000"
    assert facts["NoNewPrivs"].strip() == "1"
    assert facts["Seccomp"].strip() == "2"


async def test_bash_is_the_static_build_of_the_same_version(docker_plane: Plane) -> None:
    """Commands start faster without the dynamic loader; nothing else about bash may change."""
    session = await docker_plane.client.create_session()
    run = docker_plane.client.run
    linked = await run(session.id, ["ldd", "/bin/bash"])
    assert b"not a dynamic executable" in linked.stdout + linked.stderr
    static = (await run(session.id, ["/bin/bash", "--version"])).stdout.splitlines()[0]
    dynamic = (await run(session.id, ["/usr/bin/bash.dynamic", "--version"])).stdout.splitlines()[0]
    assert static == dynamic
    assert static.startswith(b"GNU bash, version 5.")
    tilde = await run(session.id, ["/bin/bash", "-c", "echo ~root; echo $BASH"])
    assert tilde.stdout == b"/root\n/bin/bash\n"  # user lookups (NSS) still work in the static build


async def test_container_is_hardened(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    attrs = container_of(docker_plane, session.sandbox_id).attrs
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert set(host["CapAdd"]) <= {"SETUID", "SETGID", "KILL", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}
    assert any(o.startswith("no-new-privileges") for o in host["SecurityOpt"])
    assert host["ReadonlyRootfs"] is True
    assert host["Privileged"] is False
    assert host["PidsLimit"] == 512
    assert host["Memory"] == 1024 * 1024 * 1024
    assert host["NanoCpus"] == 1_000_000_000
    assert not any("docker.sock" in str(m.get("Source")) for m in attrs["Mounts"])
    # (and the sandbox's own account files, read-only: confinement.account_mounts)
    assert {m["Destination"] for m in attrs["Mounts"]} == {"/workspace", "/run/agent", "/etc/passwd", "/etc/group"}
    # The only writable places are the workspace and /tmp.
    done = await docker_plane.client.run(session.id, command="touch /etc/x /usr/x /x 2>&1; touch /workspace/ok /tmp/ok")
    assert done.stdout.count(b"Read-only file system") == 3
    assert done.exit_code == 0


async def test_custom_resources_are_applied(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session(cpu=0.5, memory_mb=256, pids=128)
    host = container_of(docker_plane, session.sandbox_id).attrs["HostConfig"]
    assert (host["NanoCpus"], host["Memory"], host["PidsLimit"]) == (500_000_000, 256 * 1024 * 1024, 128)


async def test_resources_above_the_operator_maximum_are_refused(docker_plane: Plane) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await docker_plane.client.create_session(memory_mb=1 << 20)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "memory_mb" in (info.value.details() or "")


async def test_delete_leaves_nothing_and_is_idempotent(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    name = f"ocsb-{docker_plane.instance}-{session.sandbox_id}"
    sock_dir = docker_plane.plane.settings.data_dir / "sandboxes" / session.sandbox_id
    assert sock_dir.is_dir()
    first = await docker_plane.client.delete_session(session.id)
    second = await docker_plane.client.delete_session(session.id)
    assert first.state == second.state == session_pb2.Session.DELETED
    assert not [c for c in instance_containers(docker_plane.instance) if c.name == name]
    assert not [v for v in instance_volumes(docker_plane.instance) if v.name.startswith(name)]
    assert not sock_dir.exists()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await docker_plane.client.run(session.id, ["true"])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_abort_kills_the_whole_process_group(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    call = docker_plane.client.exec_call(session.id, command="sleep 1000 & sleep 1000")
    async for event in call:
        if event.WhichOneof("event") == "started_pid":
            break
    await asyncio.sleep(0.3)
    before = await docker_plane.client.run(session.id, ["pgrep", "-c", "-x", "sleep"])
    assert before.stdout.strip() == b"2"
    call.cancel()
    deadline = asyncio.get_running_loop().time() + 2
    while True:
        after = await docker_plane.client.run(session.id, ["pgrep", "-c", "-x", "sleep"])
        if after.stdout.strip() == b"0" or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert after.stdout.strip() == b"0"


async def test_timeout_stops_the_command(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    done = await docker_plane.client.run(session.id, command="echo partial; sleep 30", timeout_ms=300)
    assert done.timed_out
    assert done.stdout == b"partial\n"
    assert done.exit_code == 128 + 15


async def test_background_child_holding_stdout_does_not_hang(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    started = asyncio.get_running_loop().time()
    done = await docker_plane.client.run(session.id, command="sleep 30 & echo foreground done")
    assert asyncio.get_running_loop().time() - started < 5
    assert done.exit_code == 0
    assert b"foreground done" in done.stdout


async def test_stdin_is_closed_unless_asked(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    done = await docker_plane.client.run(session.id, ["cat"], timeout_ms=5000)
    assert not done.timed_out
    assert done.exit_code == 0

    async def lines() -> object:
        yield b"hello "
        yield b"stdin\n"

    fed = await docker_plane.client.run(session.id, ["cat"], stdin=lines(), timeout_ms=5000)
    assert fed.stdout == b"hello stdin\n"


async def test_no_zombies_after_many_backgrounded_children(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    for _ in range(200):
        done = await docker_plane.client.run(session.id, command="(sleep 0.01 &) ; sleep 0.02 & true")
        assert done.exit_code == 0
    await asyncio.sleep(0.5)
    ps = await docker_plane.client.run(session.id, ["ps", "-eo", "stat=,pid=,comm="])
    zombies = [line for line in ps.stdout.decode().splitlines() if line.strip().startswith("Z")]
    assert zombies == []


async def test_stdout_and_stderr_stay_in_order(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    done = await docker_plane.client.run(
        session.id, command="for i in $(seq 1 2000); do echo out$i; echo err$i >&2; done"
    )
    assert done.stdout.decode().split() == [f"out{i}" for i in range(1, 2001)]
    assert done.stderr.decode().split() == [f"err{i}" for i in range(1, 2001)]


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in [("src/pkg/deep/a.txt", b"alpha\n"), ("README.md", b"# hi\n")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("escape")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc"
        tar.addfile(link)
        through = tarfile.TarInfo("escape/pwned")
        through.size = 3
        tar.addfile(through, io.BytesIO(b"pwn"))
        climb = tarfile.TarInfo("../../etc/climbed")
        climb.size = 3
        tar.addfile(climb, io.BytesIO(b"pwn"))
    return buf.getvalue()


async def test_a_creation_cancelled_during_its_engine_calls_leaves_nothing(
    docker_plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine calls go on in their thread after the caller gave up (a shutdown cancels a pool refill). Removing
    the sandbox under them used to let the engine create the workspace volume again, unlabeled, for the
    container's mount, and the container after its own removal: both leaked."""
    provider = docker_plane.plane.sessions._provider
    assert isinstance(provider, DockerSandboxProvider)
    create_container = provider._create_container
    entered, returned = threading.Event(), threading.Event()
    ids: list[str] = []

    def slow_engine(sandbox_id: str, *args: Any) -> Any:
        ids.append(sandbox_id)
        entered.set()
        time.sleep(0.5)
        try:
            return create_container(sandbox_id, *args)
        finally:
            returned.set()

    monkeypatch.setattr(provider, "_create_container", slow_engine)
    creating = asyncio.ensure_future(provider._create_pooled())
    assert await asyncio.to_thread(entered.wait, 10)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    engine = docker.from_env()
    name, volume = provider._name(ids[0]), provider._volume(ids[0])

    def leftovers() -> list[str]:
        found = [str(c.name) for c in engine.containers.list(all=True, filters={"name": name})]
        return found + [str(v.name) for v in engine.volumes.list(filters={"name": volume})]

    try:
        assert await asyncio.to_thread(returned.wait, 30)
        for _ in range(200):  # the removal follows the engine calls in the background
            if not leftovers():
                break
            await asyncio.sleep(0.05)
        assert leftovers() == []
    finally:
        for container in engine.containers.list(all=True, filters={"name": name}):
            container.remove(force=True)
        for leaked in engine.volumes.list(filters={"name": volume}):
            leaked.remove(force=True)


async def test_workspace_upload_keeps_files_and_blocks_symlink_escape(docker_plane: Plane) -> None:
    client = docker_plane.client
    before = [s.id for s in await client.list_sessions(include_deleted=True)]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.create_session(workspace_archive=_archive())
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        'workspace upload refused: entry "escape" is a symlink to "/etc", an absolute path outside the workspace',
    )
    assert [s.id for s in await client.list_sessions(include_deleted=True)] == before
    # The agent's own extractor (defence in depth) skips the same entries when handed the archive directly.
    session = await client.create_session()
    sandbox = await docker_plane.plane.sessions.sandbox_for(session.tenant, session.id)
    summary = await sandbox.agent.upload(_archive())
    assert summary.files == 2
    assert (await client.run(session.id, ["cat", "src/pkg/deep/a.txt"])).stdout == b"alpha\n"
    assert (await client.run(session.id, ["cat", "README.md"])).stdout == b"# hi\n"
    assert (await client.run(session.id, ["readlink", "escape"])).stdout == b"/etc\n"
    assert (await client.run(session.id, ["test", "-e", "/etc/pwned"])).exit_code == 1
    assert (await client.run(session.id, ["test", "-e", "/etc/climbed"])).exit_code == 1
    # Writing through the symlink from inside fails too: the root filesystem is read-only.
    write = await client.run(session.id, command="echo x > escape/pwned")
    assert write.exit_code != 0


async def test_broken_archive_is_refused_and_leaves_nothing(docker_plane: Plane) -> None:
    provider = docker_plane.plane.sessions._provider
    hits, misses = provider.pool_stats().hits, provider.pool_stats().misses
    before = [s.id for s in await docker_plane.client.list_sessions(include_deleted=True)]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await docker_plane.client.create_session(workspace_archive=b"this is not a tar archive")
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT, "workspace upload refused: not a valid tar archive: truncated header"
    )
    assert [s.id for s in await docker_plane.client.list_sessions(include_deleted=True)] == before
    assert (provider.pool_stats().hits, provider.pool_stats().misses) == (hits, misses)  # no sandbox was taken


async def test_warm_pool_is_used_and_refilled(docker_plane: Plane) -> None:
    provider = docker_plane.plane.sessions._provider
    for _ in range(100):
        if provider.pool_stats().ready == 2:
            break
        await asyncio.sleep(0.1)
    hits = provider.pool_stats().hits
    await docker_plane.client.create_session()
    assert provider.pool_stats().hits == hits + 1
    for _ in range(100):
        if provider.pool_stats().ready == 2:
            break
        await asyncio.sleep(0.1)
    assert provider.pool_stats().ready == 2
