"""Reading the rest of a refused client stream, so that its writer sees the refusal.

A client still writing when the server ends its call sees its own write fail (grpc's INTERNAL, "Internal error
from Core") instead of the server's status. So before a refusal, the server takes what the client still sends,
until it half-closes. Always bounded: in time, in bytes, and in silence (a client waiting on its own input, say a
terminal, gets the refusal after the idle bound rather than after the whole time).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

SECONDS = 5.0
MAX_BYTES = 8 * 1024 * 1024
IDLE_S = 0.25


async def drain(requests: AsyncIterator[Any], *, seconds: float = SECONDS, max_bytes: int = MAX_BYTES,
                idle_s: float = IDLE_S) -> None:
    """Reads `requests` (protobuf messages) until the client half-closes or a bound is reached; never raises."""

    async def read() -> None:
        total = 0
        while total <= max_bytes:
            request = await asyncio.wait_for(anext(requests, None), idle_s)
            if request is None:
                return
            total += request.ByteSize()

    with contextlib.suppress(TimeoutError, grpc.RpcError, asyncio.InvalidStateError, StopAsyncIteration):
        await asyncio.wait_for(read(), seconds)
