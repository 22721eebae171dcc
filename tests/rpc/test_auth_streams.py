"""A refused token is UNAUTHENTICATED on every streaming RPC however the client writes: the client library
writes nothing until the server marks the stream accepted (controlplane.stream_accept), so a write can no
longer race the server's refusal and turn it into a local INTERNAL ("Failed execute_batch")."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.stream_accept import ACCEPTED_KEY
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
ATTEMPTS = 200
AT_ONCE = 10


plane = served_plane("local", scope="module", tenants=TENANTS, pool={"size": 0})


async def _stdin() -> AsyncIterator[bytes]:
    for _ in range(50):
        yield b"x" * 65536  # writes as fast as the transport takes them


async def _hammer(plane: Plane, attempt: str) -> collections.Counter[tuple[str, str]]:
    stranger = AsyncClient(plane.plane.address, "not-a-token")
    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    async def one() -> None:
        try:
            if attempt == "exec":
                await stranger.run("ses_x", ["cat"], stdin=_stdin())
            else:
                await stranger.execute_tool("ses_x", "read", {"filePath": "a.txt"})
        except grpc.aio.AioRpcError as exc:
            seen[(exc.code().name, exc.details() or "")] += 1

    for _ in range(ATTEMPTS // AT_ONCE):
        await asyncio.gather(*(one() for _ in range(AT_ONCE)))
    await stranger.close()
    return seen


@pytest.mark.parametrize("attempt", ["exec", "execute_tool"])
async def test_a_wrong_token_is_unauthenticated_every_time_on_a_writing_stream(plane: Plane, attempt: str) -> None:
    seen = await _hammer(plane, attempt)
    assert seen == {("UNAUTHENTICATED", "unknown bearer token"): ATTEMPTS}


async def test_only_an_accepted_request_stream_carries_the_mark(plane: Plane) -> None:
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        method: grpc.aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
            "/controlplane.v1.ToolService/ExecuteTool"
        )
        refused = method(metadata=(("authorization", "Bearer wrong"),))
        assert ACCEPTED_KEY not in dict(await refused.initial_metadata() or ())
        assert await refused.code() == grpc.StatusCode.UNAUTHENTICATED
        accepted = method(metadata=(("authorization", "Bearer token-alpha"),))
        assert dict(await accepted.initial_metadata() or ()).get(ACCEPTED_KEY) == "1"
        await accepted.done_writing()  # no `call` message: the handler refuses it
        assert await accepted.code() == grpc.StatusCode.INVALID_ARGUMENT
