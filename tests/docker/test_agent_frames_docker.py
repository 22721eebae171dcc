"""The agent's shared streams on frames in real sandboxes, on runc and on gVisor: `bash`, `read` and an exec ride
`frames.sock` (sandbox_agent/frames.py) where the sandbox's agent binds it. On gVisor the socket is bound by the
sandbox's kernel in the host dir (the engine's `--host-uds=all`), and the plane connects to it from the host:
these tests show it does, rather than falling back to gRPC."""

from __future__ import annotations

import asyncio
import stat
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.client import allow_once
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.agent_frames import FramedStreamCall
from controlplane.v1 import session_pb2
from tests import runtimes
from tests.archives import tar_of
from tests.faults.sandboxes import SLEEP, container_of, wait_until_running
from tests.planes import Plane, running_plane

runtime = runtimes.runtime
"""runc, then gVisor where it runs (tests/runtimes.py)."""

pytestmark = pytest.mark.docker
LOST_WITHIN_S = 1.0
"""As tests/faults/test_sandbox_faults.py: from the kill to the caller's typed error."""


@pytest.fixture(scope="module")
async def plane(runtime: str) -> AsyncIterator[Plane]:
    async with running_plane("docker", provider_options={"runtime": runtime}, pool={"size": 0}) as served:
        yield served


async def _agent(plane: Plane, session_id: str) -> GrpcSandboxAgent:
    live = plane.plane.sessions.live_session(session_id)
    assert live is not None
    sandbox = await plane.plane.sessions.sandbox_for(live.tenant, session_id)
    assert isinstance(sandbox.agent, GrpcSandboxAgent)
    return sandbox.agent


async def test_bash_read_and_exec_ride_the_framed_socket(plane: Plane, runtime: str) -> None:
    session = await plane.client.create_session(workspace_archive=tar_of({"five.txt": "1\n2\n3\n4\n5\n"}))
    try:
        framed = plane.plane.settings.data_dir / "sandboxes" / session.sandbox_id / "frames.sock"
        assert stat.S_ISSOCK(framed.lstat().st_mode)  # bound in the host dir, on gVisor by its own kernel
        bash = await plane.client.execute_tool(session.id, "bash", {"command": "echo hi", "description": "d"},
                                               on_permission=allow_once)
        assert bash.output == "hi\n"
        read = await plane.client.execute_tool(session.id, "read", {"filePath": "/workspace/five.txt"},
                                               on_permission=allow_once)
        assert "<content>1: 1\n2: 2\n3: 3\n4: 4\n5: 5\n" in read.output
        done = await plane.client.run(session.id, ["true"])
        assert done.exit_code == 0
        echoed = await plane.client.run(session.id, ["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (echoed.stdout, echoed.stderr, echoed.exit_code) == (b"out\n", b"err\n", 3)
        agent = await _agent(plane, session.id)
        assert agent._tool_stream is not None
        assert agent._exec_stream is not None
        assert isinstance(agent._tool_stream._call, FramedStreamCall), runtime
        assert isinstance(agent._exec_stream._call, FramedStreamCall), runtime
    finally:
        await plane.client.delete_session(session.id)


async def test_a_sandbox_killed_mid_exec_is_unavailable_within_a_second_and_the_next_session_is_framed(
        plane: Plane, runtime: str) -> None:
    # The framed stream's end (the agent's connection gone with its container) is what a dropped gRPC stream
    # gave: UNAVAILABLE naming the sandbox, promptly (tests/faults/test_sandbox_faults.py's bound).
    session = await plane.client.create_session()
    running = asyncio.ensure_future(plane.client.run(session.id, command=SLEEP))
    await wait_until_running(plane.client, session.id, SLEEP)
    stream = (await _agent(plane, session.id))._exec_stream
    assert stream is not None
    assert isinstance(stream._call, FramedStreamCall), runtime
    started = time.monotonic()
    await asyncio.to_thread(lambda: container_of(plane.instance, session.sandbox_id).kill())
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await asyncio.wait_for(running, 10)
    elapsed = time.monotonic() - started
    assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (lost.value.details() or "").startswith(f"sandbox {session.sandbox_id} is not answering (UNAVAILABLE: ")
    assert elapsed <= LOST_WITHIN_S, f"{elapsed:.3f} s"
    assert (await plane.client.get_session(session.id)).state == session_pb2.Session.FAILED
    await plane.client.delete_session(session.id)
    again = await plane.client.create_session()
    try:
        assert (await plane.client.run(again.id, ["echo", "again"])).stdout == b"again\n"
        stream = (await _agent(plane, again.id))._exec_stream
        assert stream is not None
        assert isinstance(stream._call, FramedStreamCall)
    finally:
        await plane.client.delete_session(again.id)
