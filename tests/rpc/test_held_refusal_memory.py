"""What a held refusal keeps in the control plane: a tenant over its `calls` quota whose client does not wait for the
acceptance mark and sends a big first message on each of many Exec streams holds at most the tenant's bound of
refusal bytes, not its messages; another tenant's Execs stay fast meanwhile. A wrong token retried in a loop is
answered on a schedule too, and always UNAUTHENTICATED (through the public API, real gRPC on loopback; the
flooding client runs in a process of its own, so that its send buffers are not counted as the plane's)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.core.tenants.refusals import BURST, MAX_HELD_BYTES, REFUSAL_PAUSE_S, REFUSALS_PER_S
from controlplane.v1 import sandbox_pb2, sandbox_pb2_grpc, session_pb2, session_pb2_grpc
from tests.plane_memory import rss
from tests.planes import served_plane, tenant_clients

TENANTS: list[dict[str, Any]] = [
    {"name": "hoarder", "token": "token-hoarder", "quota": {"calls": 1}},
    {"name": "neighbour", "token": "token-neighbour"},
]
STREAMS = 64
MESSAGE_MIB = 8
FLOOD_S = 6.0
GROWTH_BOUND = MAX_HELD_BYTES + (32 << 20)
"""The tenant's bound on held refusal bytes, and room for what the plane's own allocator keeps (RSS is coarse)."""

plane = served_plane("local", tenants=TENANTS, pool={"size": 0})
clients = tenant_clients(TENANTS)



async def flood(address: str, session_id: str, streams: int, mib: int, seconds: float) -> dict[str, int]:
    """Exec streams, each sending at once one ExecRequest of `mib` MiB and never half-closing, re-opened when
    answered, for `seconds`: a hostile client (the client library waits for the acceptance mark)."""
    auth = (("authorization", f"Bearer {TENANTS[0]['token']}"),)
    big = sandbox_pb2.ExecRequest(start=sandbox_pb2.ExecStart(session_id=session_id, argv=["true"],
                                                               env={"X": "x" * (mib << 20)}))
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 256 << 20)])
                for _ in range(max(1, streams // 32))]
    codes: Counter[str] = Counter()
    end = time.monotonic() + seconds

    async def one(i: int) -> None:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channels[i % len(channels)])
        while time.monotonic() < end:
            async def requests() -> AsyncIterator[sandbox_pb2.ExecRequest]:
                yield big
                await asyncio.sleep(3600)

            call = stub.Exec(requests(), metadata=auth)
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1

    tasks = [asyncio.ensure_future(one(i)) for i in range(streams)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close(None)
    return dict(codes)


async def test_held_exec_refusals_with_big_first_messages_stay_under_the_tenants_bound(
    plane: Any, clients: dict[str, AsyncClient],
) -> None:
    hoarder, neighbour = clients["hoarder"], clients["neighbour"]
    mine = (await hoarder.create_session()).id
    theirs = (await neighbour.create_session()).id
    holder = hoarder.exec_call(mine, ["sleep", "60"])  # takes the hoarder's one call slot
    events = holder.__aiter__()
    await events.__anext__()
    await neighbour.run(theirs, ["true"])
    before = rss()
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, plane.plane.address, mine, str(STREAMS), str(MESSAGE_MIB), str(FLOOD_S),
        stdout=subprocess.PIPE)
    peak = before
    took: list[float] = []
    try:
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_S:
            asked = time.monotonic()
            result = await neighbour.run(theirs, ["true"])
            took.append(time.monotonic() - asked)
            assert result.exit_code == 0
            peak = max(peak, rss())
            await asyncio.sleep(0.05)
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        holder.cancel()
    codes = json.loads(out)
    assert codes, "the flooding client was never answered"
    growth = peak - before
    # On a plane whose streams' windows grow with the client's sending, 64 streams of 8 MiB held ~600 MiB.
    assert growth < GROWTH_BOUND, f"the plane grew by {growth >> 20} MiB holding refusals ({codes})"
    took.sort()
    assert took[len(took) // 2] < 0.5, f"the neighbour's Exec took {took} s during the flood"


async def test_a_wrong_token_retried_in_a_loop_is_answered_on_a_schedule_and_always_unauthenticated(
    plane: Any,
) -> None:
    channel = grpc.aio.insecure_channel(plane.plane.address)
    wrong = (("authorization", "Bearer not-a-token-anyone-holds"),)
    sessions = session_pb2_grpc.SessionServiceStub(channel)
    execs = sandbox_pb2_grpc.SandboxServiceStub(channel)
    codes: Counter[str] = Counter()
    seconds = 2.0
    end = time.monotonic() + seconds

    async def unary() -> None:
        while time.monotonic() < end:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await sessions.ListSessions(session_pb2.ListSessionsRequest(), metadata=wrong)
            codes[info.value.code().name] += 1

    async def streaming() -> None:
        # Sends at once, without waiting for the acceptance mark: still told UNAUTHENTICATED.
        while time.monotonic() < end:
            async def requests() -> AsyncIterator[sandbox_pb2.ExecRequest]:
                yield sandbox_pb2.ExecRequest(start=sandbox_pb2.ExecStart(session_id="x", argv=["true"]))
                await asyncio.sleep(3600)

            call = execs.Exec(requests(), metadata=wrong)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            codes[info.value.code().name] += 1

    try:
        await asyncio.gather(*(unary() for _ in range(10)), *(streaming() for _ in range(10)))
    finally:
        await channel.close(None)
    assert set(codes) == {"UNAUTHENTICATED"}, codes
    # A loop answered at once made thousands; on the schedule: the burst, then the rate, and the 20 loops'
    # last ones (each in flight when the window closed).
    assert sum(codes.values()) <= BURST + REFUSALS_PER_S * (seconds + REFUSAL_PAUSE_S) + 20, codes


async def wrong_token_creates(address: str, loops: int, mib: int, seconds: float) -> dict[str, int]:
    """CreateSession with a token no tenant holds and an archive of `mib` MiB, each loop on a channel of its own,
    for `seconds`: anyone who reaches the port."""
    wrong = (("authorization", "Bearer not-a-token-anyone-holds"),)
    request = session_pb2.CreateSessionRequest(workspace_archive=b"\0" * (mib << 20))
    codes: Counter[str] = Counter()
    end = time.monotonic() + seconds

    async def one() -> None:
        async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 256 << 20)]) as ch:
            stub = session_pb2_grpc.SessionServiceStub(ch)
            while time.monotonic() < end:
                try:
                    await stub.CreateSession(request, metadata=wrong, timeout=30)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1

    await asyncio.gather(*(one() for _ in range(loops)))
    return dict(codes)


async def test_a_wrong_tokens_big_requests_are_never_read(plane: Any, clients: dict[str, AsyncClient]) -> None:
    """gRPC reads a unary request whole before any handler runs: refused CreateSessions of 48 MiB archives from 8
    clients grew the plane by 2.9 GiB. The refusal now never reads the request."""
    neighbour = clients["neighbour"]
    theirs = (await neighbour.create_session()).id
    await neighbour.run(theirs, ["true"])
    before = rss()
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "creates", plane.plane.address, "4", "32", "4", stdout=subprocess.PIPE)
    peak = before
    try:
        while child.returncode is None:
            assert (await neighbour.run(theirs, ["true"])).exit_code == 0
            peak = max(peak, rss())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), 0.05)
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    codes = json.loads(out)
    assert set(codes) == {"UNAUTHENTICATED"}, codes
    growth = peak - before
    assert growth < 96 << 20, f"the plane grew by {growth >> 20} MiB refusing unread requests ({codes})"


if __name__ == "__main__":
    if sys.argv[1] == "creates":
        address, loops, mib, seconds = sys.argv[2:6]
        print(json.dumps(asyncio.run(wrong_token_creates(address, int(loops), int(mib), float(seconds)))))
    else:
        address, session_id, streams, mib, seconds = sys.argv[1:6]
        print(json.dumps(asyncio.run(flood(address, session_id, int(streams), int(mib), float(seconds)))))
