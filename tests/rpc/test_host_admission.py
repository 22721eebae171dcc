"""Host admission through the public API: the sum of reservations never exceeds the host's capacity,
and a request whose limits exceed the host's total is refused naming the limit (local plane)."""

from __future__ import annotations

import grpc
import pytest

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
