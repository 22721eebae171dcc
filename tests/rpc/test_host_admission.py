"""Host admission through the public API: the sum of reservations never exceeds the host's capacity,
and a request whose limits exceed the host's total is refused naming the limit (local plane)."""

from __future__ import annotations

import grpc
import pytest

from controlplane.errors import SandboxError
from tests.planes import Plane, served_plane

plane = served_plane("local", pool={"size": 0}, host={"cpu": 1.0, "memory_mb": 256},
                     resources={"cpu": 0.5, "memory_mb": 128, "reserve": {"cpu": 0.1, "memory_mb": 64}})


async def test_the_host_is_not_overcommitted(plane: Plane) -> None:
    client = plane.client
    made = [await client.create_session() for _ in range(4)]  # 4 x 64 MiB reserved: the host's 256 MiB
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.create_session()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == (
        "the host is full: 4 sessions reserve 256 of its 256 MiB of memory (resources.reserve.memory_mb 64 each)"
    )
    assert len(await client.list_sessions()) == 4  # the refused create left nothing
    await client.delete_session(made[0].id)
    await client.create_session()  # its reservation was given back
    for session in await client.list_sessions():
        await client.delete_session(session.id)


async def test_limits_beyond_the_host_are_refused_naming_them(plane: Plane) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plane.client.create_session(cpu=1.5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "resources.cpu must be between 0.01 and 1.0, got 1.5"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await plane.client.create_session(memory_mb=512)
    assert info.value.details() == "resources.memory_mb must be between 32 and 256, got 512"
    session = await plane.client.create_session(cpu=1.0, memory_mb=256)  # the host's whole: allowed
    await plane.client.delete_session(session.id)


async def test_a_sandbox_whose_removal_fails_keeps_its_reservation(plane: Plane,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The reservation stands for a sandbox that still runs: freeing it before the removal succeeded let a tenant
    # create past the host's capacity while the engine was still removing (slowly, or never) what it had.
    client = plane.client
    made = [await client.create_session() for _ in range(4)]  # the host is full
    provider = plane.plane.sessions._provider
    real_destroy = provider.destroy

    async def engine_refuses(sandbox_id: str) -> None:
        raise SandboxError(f"container ocsb-x-{sandbox_id} was not removed within 300 s")

    monkeypatch.setattr(provider, "destroy", engine_refuses)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.delete_session(made[0].id)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.create_session()  # its sandbox is still there: so is its reservation
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    monkeypatch.setattr(provider, "destroy", real_destroy)
    await client.delete_session(made[0].id)  # the retry removes it, and only then gives the reservation back
    await client.create_session()
    for session in await client.list_sessions():
        await client.delete_session(session.id)
