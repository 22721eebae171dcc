"""Flow control of a command's stdin through the public Exec, on a real sandbox: a client streaming 2 GiB into a
command that does not read is held by gRPC once the call's window is used up (the plane stays small, the sandbox's
agent too), and 50 MiB streamed into `cat > file` arrives whole. The plane runs in this process: its RSS is what is
measured."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from tests.plane_memory import rss_mib
from tests.planes import Plane
from tests.rpc.test_stdin_flow_control import AHEAD_MIB, MIB, Flood, started_pid

pytestmark = pytest.mark.docker

GROWTH_MIB = 96
"""What the plane (and this test's client) may grow by: the window and gRPC's buffers (on main the plane took
+3.9 GiB in 14 s from a client streaming into `sleep 600`)."""


async def test_a_client_streaming_2_gib_into_sleep_leaves_the_plane_small(docker_plane: Plane) -> None:
    session = await docker_plane.client.create_session()
    flood = Flood()
    before = peak = rss_mib()
    call = docker_plane.client.exec_call(session.id, ["sleep", "600"], stdin=flood())
    try:
        await started_pid(call)
        for _ in range(10):  # five seconds: on main the plane had taken the cap's 256 MiB well before
            await asyncio.sleep(0.5)
            peak = max(peak, rss_mib())
        assert flood.sent < AHEAD_MIB * MIB, f"the client got {flood.sent >> 20} MiB ahead of a command not reading"
        assert peak - before < GROWTH_MIB, f"the plane grew by {peak - before} MiB"
        ok = await asyncio.wait_for(docker_plane.client.run(session.id, ["echo", "ok"]), 20)
        assert ok.stdout == b"ok\n"  # the session's other calls go on
    finally:
        call.cancel()
        await docker_plane.client.delete_session(session.id)


async def test_50_mib_streamed_into_cat_arrives_whole(docker_plane: Plane) -> None:
    size = 50 * MIB
    pieces = [hashlib.sha256(str(i).encode()).digest() * (MIB // 32) for i in range(size // MIB)]
    expected = hashlib.sha256(b"".join(pieces)).hexdigest()
    flood = Flood(total=size, data=lambda i: pieces[i])
    session = await docker_plane.client.create_session()
    try:
        call = docker_plane.client.exec_call(
            session.id, command="sleep 3; cat > big.bin && sha256sum big.bin && rm big.bin", stdin=flood(),
            timeout_ms=180_000)
        events = aiter(call)
        assert (await anext(events)).WhichOneof("event") == "started_pid"
        await asyncio.sleep(2)
        assert flood.sent < AHEAD_MIB * MIB, f"the client got {flood.sent >> 20} MiB ahead"  # on main: all 50
        out, exited = b"", None
        async for event in events:
            if event.WhichOneof("event") == "stdout":
                out += event.stdout
            elif event.WhichOneof("event") == "exited":
                exited = event.exited
                break
        assert exited is not None
        assert exited.exit_code == 0, exited
        assert out.split()[0].decode() == expected
    finally:
        await docker_plane.client.delete_session(session.id)
