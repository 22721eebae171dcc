"""Resource attacks from inside a session: each is held by a limit, and the agent and other sessions keep working.

Every attack runs on runc and on gVisor (`runtime_plane`); the host counts a sandbox's processes through
tests/security/sandbox_processes.py, which asks gVisor's own accounting where the host cannot see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import statistics
import time
from collections.abc import AsyncIterator

import docker
import grpc
import pytest

from controlplane.client import AsyncClient, Session, ToolOutcome, allow_once
from controlplane.v1 import tool_pb2
from tests.planes import Plane, container_gone
from tests.runtimes import gvisor_gap
from tests.security.sandbox_processes import container_processes, pids_current

pytestmark = pytest.mark.docker

ABORTED = "\n\n<bash_metadata>\nUser aborted the command\n</bash_metadata>"
OOM_NOTE = ("\n\n<bash_metadata>\nOut of memory: the kernel killed a process of this session at its memory limit"
            " (256 MiB)\n</bash_metadata>")
HOLDING_BOMB = "bomb(){ bomb|bomb& }; bomb; exec sleep 600"
"""A classic fork bomb whose first shell then waits (without forking) so the call stays open."""
ROUNDS = int(os.environ.get("OCSB_ATTACK_ROUNDS", "1"))
"""Repetitions of the racy attacks (`make attack` sets more)."""
DETACHED_BOMB = "bomb(){ bomb|bomb& }; bomb"
"""The same bomb, but the call's own shell returns at once and leaves it running in the background."""


async def bash(client: AsyncClient, session_id: str, command: str) -> ToolOutcome:
    # Asks (paths outside the workspace) are approved: the limits, not a prompt, must hold.
    return await client.execute_tool(session_id, "bash", {"command": command, "description": "Attack"},
                                     on_permission=allow_once)


def container_id(plane: Plane, sandbox_id: str) -> str:
    return str(docker.from_env().containers.get(f"ocsb-{plane.instance}-{sandbox_id}").id)


def bomb_processes(cid: str, runtime: str) -> list[str]:
    return [name for name in container_processes(cid, runtime) if name in ("bash", "sleep")]


FORK_BOMB_ENDS_GVISOR = (
    "gVisor (Debian's runsc 2022, ptrace platform) backs guest processes with host tasks inside the container's "
    "host pids cgroup: a bomb that keeps forking at the guest limit makes them outgrow the host limit, which ends "
    "the whole sandbox (the session is lost, its neighbours are not): docs/security.md, gap 9"
)
OOM_ENDS_GVISOR = (
    "on gVisor the memory limit holds the Sentry itself: a memory bomb gets the sandbox killed, not the process "
    "(the session is lost, its neighbours are not): docs/security.md, gap 9"
)


async def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def agent_health_latency(plane: Plane, sandbox_id: str) -> float:
    sandbox = await plane.plane.sessions._provider.get(sandbox_id)
    started = time.monotonic()
    await sandbox.agent.health(timeout_s=5.0)
    return time.monotonic() - started


class RunningCall:
    """A bash call left running so the test can act meanwhile, then abort it."""

    def __init__(self, client: AsyncClient, session_id: str, command: str) -> None:
        self.stream, self.outbox = client.tool_call(session_id, "bash", {"command": command, "description": "Attack"})
        self.ended = asyncio.ensure_future(self._consume())

    async def _consume(self) -> tool_pb2.ToolEvent:
        async for event in self.stream:
            kind = event.WhichOneof("event")
            if kind == "permission_request":
                reply = tool_pb2.PermissionReply(
                    request_id=event.permission_request.id, reply=tool_pb2.PermissionReply.ONCE
                )
                self.outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=reply))
            elif kind in ("result", "error"):
                return event
        raise AssertionError("the call ended without a result")

    async def abort(self) -> tool_pb2.ToolEvent:
        self.outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="test")))
        event = await asyncio.wait_for(self.ended, 10)
        self.outbox.put_nowait(None)
        return event


@pytest.fixture
async def victim(runtime_plane: Plane) -> AsyncIterator[Session]:
    """A session the attack may ruin; deleted afterwards."""
    session = await runtime_plane.client.create_session()
    yield session
    await runtime_plane.client.delete_session(session.id)


@pytest.fixture(scope="module")
async def neighbour(runtime_plane: Plane) -> AsyncIterator[Session]:
    """Another session that must not notice the attacks."""
    session = await runtime_plane.client.create_session()
    yield session
    await runtime_plane.client.delete_session(session.id)


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_fork_bomb_is_held_by_the_pids_limit_and_abort_clears_it(
    runtime_plane: Plane, victim: Session, neighbour: Session, round_: int, runtime: str,
    request: pytest.FixtureRequest,
) -> None:
    gvisor_gap(request, runtime, FORK_BOMB_ENDS_GVISOR)
    client, cid = runtime_plane.client, container_id(runtime_plane, victim.sandbox_id)
    baseline = pids_current(cid, runtime)
    call = RunningCall(client, victim.id, HOLDING_BOMB)
    await wait_for(lambda: pids_current(cid, runtime) >= 500, 15, "the bomb to reach the pids limit")
    assert pids_current(cid, runtime) <= 512
    assert await agent_health_latency(runtime_plane, victim.sandbox_id) < 2.0
    assert (await bash(client, neighbour.id, "echo fine")).output == "fine\n"
    started = time.monotonic()
    event = await call.abort()
    assert time.monotonic() - started < 5
    assert event.WhichOneof("event") == "result"
    assert event.result.output.endswith(ABORTED)
    assert json.loads(event.result.metadata_json)["exit"] is None
    # pids.current also counts threads (the agent's, a tool host's), so the bomb is judged by its processes.
    await wait_for(lambda: not bomb_processes(cid, runtime), 5, "the bomb's processes to be gone")
    assert pids_current(cid, runtime) < baseline + 40
    ps = await bash(client, victim.id, "ps -eo user=,comm=")
    # A tool host (bun) may have been started by the session's first call: it is not part of the bomb.
    assert [line for line in ps.output.splitlines() if line != "tool     bun"] == [
        "root     docker-init", "root     python3", "tool     python3", "tool     ps",
    ]


async def test_detached_fork_bomb_is_contained_and_removed_with_its_session(
    runtime_plane: Plane, neighbour: Session, runtime: str, request: pytest.FixtureRequest,
) -> None:
    if runtime == "runsc":
        # Not strict: the guest limit holds this bomb, and whether the Sentry's host tasks outgrow the host limit
        # before the session is deleted depends on the machine's speed (both were seen).
        request.applymarker(pytest.mark.xfail(strict=False, reason=FORK_BOMB_ENDS_GVISOR))
    client = runtime_plane.client
    session = await client.create_session()
    cid = container_id(runtime_plane, session.sandbox_id)
    try:
        # Like OpenCode, a call returns when its shell exits and leaves background processes running.
        done = await bash(client, session.id, DETACHED_BOMB)
        assert done.error is None
        await wait_for(lambda: pids_current(cid, runtime) >= 500, 15, "the bomb to reach the pids limit")
        await asyncio.sleep(1.0)
        assert pids_current(cid, runtime) <= 512
        assert await agent_health_latency(runtime_plane, session.sandbox_id) < 2.0
        assert (await bash(client, neighbour.id, "echo fine")).output == "fine\n"
    finally:
        started = time.monotonic()
        await client.delete_session(session.id)
        took = time.monotonic() - started
    assert took < 15
    assert container_gone(cid)


@pytest.mark.parametrize("bomb", [DETACHED_BOMB, "python3 -c \"s = b'x' * (4 << 30)\""], ids=["fork", "memory"])
async def test_a_bomb_that_ends_its_gvisor_sandbox_leaves_the_neighbours_working(
    runtime_plane: Plane, neighbour: Session, runtime: str, bomb: str,
) -> None:
    """What gVisor does hold where the two tests around this one xfail: the bomb takes only its own sandbox."""
    if runtime != "runsc":
        pytest.skip("runc holds these bombs inside the session (the tests around this one)")
    client = runtime_plane.client
    session = await client.create_session(memory_mb=256)
    cid = container_id(runtime_plane, session.sandbox_id)
    try:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await bash(client, session.id, bomb)  # a lost sandbox fails the call; a detached bomb returns at once
        await asyncio.sleep(3.0)  # the bomb has hit its limit by now (about a second here)
        assert (await bash(client, neighbour.id, "echo fine")).output == "fine\n"
        assert await agent_health_latency(runtime_plane, neighbour.sandbox_id) < 2.0
    finally:
        await client.delete_session(session.id)
    assert container_gone(cid)


async def test_memory_bomb_is_oom_killed_and_the_session_keeps_working(
    runtime_plane: Plane, runtime: str, request: pytest.FixtureRequest,
) -> None:
    gvisor_gap(request, runtime, OOM_ENDS_GVISOR)
    client = runtime_plane.client
    session = await client.create_session(memory_mb=256)
    try:
        agent_before = (await bash(client, session.id, "pgrep -xf 'python3 -m sandbox_agent'")).output
        bomb = await bash(client, session.id, "python3 -c \"s = b'x' * (512 << 20)\"")
        # OpenCode reports an OOM kill like any other SIGKILL (no output, exit null); we add a note and a flag.
        assert bomb.output == OOM_NOTE
        assert bomb.metadata == {"output": OOM_NOTE, "exit": None, "description": "Attack", "truncated": False,
                                 "out_of_memory": True}
        wrapped = await bash(client, session.id, "python3 -c \"s = b'x' * (512 << 20)\"; echo exit=$?")
        assert re.fullmatch(r"/bin/bash: line 1: +\d+ Killed +python3 -c \"s = b'x' \* \(512 << 20\)\"\nexit=137\n",
                            wrapped.output.removesuffix(OOM_NOTE)), wrapped.output
        assert wrapped.output.endswith(OOM_NOTE)
        assert wrapped.metadata["exit"] == 0
        calm = await bash(client, session.id, "python3 -c \"s = b'x' * (64 << 20)\"; echo fine")
        assert calm.output == "fine\n"
        assert "out_of_memory" not in calm.metadata
        events = await bash(client, session.id, (
            "grep -h '^oom_kill ' /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null"
        ))
        assert events.output == "oom_kill 2\n"
        after = await bash(client, session.id, "echo still here; pgrep -xf 'python3 -m sandbox_agent'")
        assert after.output == "still here\n" + agent_before
    finally:
        await client.delete_session(session.id)


@pytest.mark.parametrize(("mount", "size_mb"), [("/tmp", 256), ("/dev/shm", 64)])
async def test_tmpfs_fill_stops_at_its_size(runtime_plane: Plane, neighbour: Session, mount: str, size_mb: int) -> None:
    out = await bash(runtime_plane.client, neighbour.id, (
        f"head -c {size_mb + 50}M /dev/zero > {mount}/fill; echo rc=$?; wc -c < {mount}/fill;"
        f" rm {mount}/fill; echo ok > {mount}/after; cat {mount}/after; rm {mount}/after"
    ))
    lines = out.output.splitlines()
    assert lines[:2] == ["head: error writing 'standard output': No space left on device", "rc=1"]
    # /tmp also holds the tool's HOME (a few KiB), so the file gets slightly less than the whole tmpfs.
    assert (size_mb - 1) << 20 <= int(lines[2]) <= size_mb << 20
    assert lines[3:] == ["ok"]


def docker_root() -> str:
    return str(docker.from_env().info()["DockerRootDir"])


async def test_workspace_has_its_own_bounded_disk(runtime_plane: Plane, neighbour: Session, runtime: str) -> None:
    # find, not `ls -A`: gVisor answers coreutils' statx of /workspace with EINVAL (docs/security.md, gap 7).
    out = await bash(runtime_plane.client, neighbour.id,
                     "stat -f -c '%S %b %T' /workspace; find /workspace -mindepth 1 | wc -l")
    block, blocks, fstype, entries = out.output.split()
    host = os.statvfs(docker_root())
    assert int(block) * int(blocks) < host.f_frsize * host.f_blocks, "the workspace is as large as the host's disk"
    # resources.disk_mb (2048 by default) less ext4's own metadata; a fresh workspace is empty (no lost+found).
    # gVisor serves the same ext4 disk through its gofer, which statfs names 9p.
    assert (fstype, entries) == ("v9fs" if runtime == "runsc" else "ext2/ext3", "0")
    assert 1900 << 20 <= int(block) * int(blocks) <= 2048 << 20


@pytest.mark.parametrize("how", ["fallocate -l 3G ", "dd if=/dev/zero bs=1M count=2100 status=none of="])
async def test_workspace_fill_is_stopped_and_reported(runtime_plane: Plane, victim: Session, how: str) -> None:
    client = runtime_plane.client
    out = await bash(client, victim.id, f"{how}/workspace/fill; echo rc=$?")
    full = "\n\n<bash_metadata>\nNo space left on device: /workspace is full (1945 MiB)\n</bash_metadata>"
    refusal = ("fallocate: fallocate failed: No space left on device\n" if how.startswith("fallocate ")
               else "dd: error writing '/workspace/fill': No space left on device\n")
    # ext4 keeps what a failed fallocate did allocate, so either way the disk is full afterwards.
    assert out.output == refusal + "rc=1\n" + full
    assert out.metadata["disk_full"] == ["/workspace"]
    after = await bash(client, victim.id, "rm -f /workspace/fill; echo ok > /workspace/after; cat"
                                          " /workspace/after")
    assert after.output == "ok\n"
    assert "disk_full" not in after.metadata


async def test_tmp_fill_is_reported(runtime_plane: Plane, victim: Session) -> None:
    client = runtime_plane.client
    out = await bash(client, victim.id, "head -c 300M /dev/zero > /tmp/fill; echo rc=$?")
    assert out.output == (
        "head: error writing 'standard output': No space left on device\nrc=1\n"
        "\n\n<bash_metadata>\nNo space left on device: /tmp is full (256 MiB)\n</bash_metadata>"
    )
    assert out.metadata["disk_full"] == ["/tmp"]
    assert (await bash(client, victim.id, "rm /tmp/fill; echo ok")).output == "ok\n"


async def test_dev_shm_is_bounded_noexec_nosuid(runtime_plane: Plane, neighbour: Session, runtime: str) -> None:
    out = await bash(runtime_plane.client, neighbour.id, (
        "grep ' /dev/shm ' /proc/self/mounts; cp /bin/true /dev/shm/t && /dev/shm/t; echo rc=$?; rm -f /dev/shm/t"
    ))
    # gVisor words its mount line its own way; it runs no set-user-ID program anywhere, so nosuid holds there too.
    mount = ("none /dev/shm tmpfs rw,noexec,size=64m,mode=1777 0 0\n" if runtime == "runsc"
             else "tmpfs /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k 0 0\n")
    assert out.output == mount + "/bin/bash: line 1: /dev/shm/t: Permission denied\nrc=126\n"


async def test_cpu_hog_does_not_starve_a_neighbours_reads(
    runtime_plane: Plane, neighbour: Session, victim: Session, record_property: object, runtime: str
) -> None:
    client = runtime_plane.client
    assert (await bash(client, neighbour.id, "seq 1 200 > lines.txt && echo ok")).output == "ok\n"

    async def read_latencies(n: int) -> list[float]:
        took = []
        for _ in range(n):
            started = time.monotonic()
            out = await client.execute_tool(neighbour.id, "read", {"filePath": "/workspace/lines.txt"},
                                            on_permission=allow_once)  # the third identical read asks (doom_loop)
            took.append(time.monotonic() - started)
            assert out.error is None
        return took

    idle = await read_latencies(20)
    hog = RunningCall(client, victim.id, "for i in 1 2 3 4; do (while :; do :; done) & done; wait")
    cid = container_id(runtime_plane, victim.sandbox_id)
    await wait_for(lambda: pids_current(cid, runtime) >= 8, 5, "the hog to start")
    await asyncio.sleep(0.5)
    busy = await read_latencies(20)
    event = await hog.abort()
    assert event.result.output == ABORTED
    numbers = {
        "idle_p50_ms": round(statistics.median(idle) * 1000, 2), "idle_max_ms": round(max(idle) * 1000, 2),
        "hog_p50_ms": round(statistics.median(busy) * 1000, 2), "hog_max_ms": round(max(busy) * 1000, 2),
    }
    record_property("read_latency", numbers)  # type: ignore[operator]
    print(f"read latency next to a CPU hog: {numbers}")
    # Generous: the hog's session is limited to 1 CPU, so the neighbour's reads must stay interactive.
    assert statistics.median(busy) < 0.5, numbers
    assert max(busy) < 3.0, numbers


async def test_agent_of_a_deleted_session_cannot_be_reached(runtime_plane: Plane) -> None:
    session = await runtime_plane.client.create_session()
    await runtime_plane.client.delete_session(session.id)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await bash(runtime_plane.client, session.id, "echo no")
    assert info.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
