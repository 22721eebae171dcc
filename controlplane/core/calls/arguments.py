"""Bounds on a tool call's arguments: a size refused before any parsing, and large ones handled off the loop.

The control plane serves every tenant from one event loop, so parsing and validating a multi-MiB argument
object there would make every other tenant's RPC wait for it (eight 4 MiB todo lists once held the loop
for half a minute). Small arguments stay on the loop: a thread hop costs more than they take.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import ParamSpec, TypeVar

from controlplane.errors import InvalidArgumentError

DEFAULT_MAX_ARGS_BYTES = 8 * 1024 * 1024
"""Twice the largest argument object the suite sends (a 3 MiB bash command, 1 MiB todo lists), an eighth
of the default message cap: real tool calls (a whole file to write) fit, a flood of them does not add up
to the control plane's memory."""
OFF_LOOP_BYTES = 64 * 1024
"""From this size on, parsing and validation run in a worker thread (a 64 KiB object takes about a ms)."""

P = ParamSpec("P")
T = TypeVar("T")


def size(args_json: str) -> int:
    """The arguments' size in UTF-8 bytes, without encoding an ASCII text."""
    return len(args_json) if args_json.isascii() else len(args_json.encode("utf-8", "surrogatepass"))


def check_size(args_json: str, limit: int) -> None:
    """INVALID_ARGUMENT naming the limit when the arguments are larger than `limit` bytes (0: no limit)."""
    if limit <= 0 or len(args_json) <= limit // 4:  # cheap: a char is at most four bytes
        return
    n = size(args_json)
    if n > limit:
        raise InvalidArgumentError(
            f"tool call arguments are {n} bytes; the limit is {limit} bytes (limits.max_args_bytes)"
        )


async def handled(n: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`, in a worker thread when the arguments it works on are `n` >= OFF_LOOP_BYTES."""
    if n >= OFF_LOOP_BYTES:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


class TenantLanes:
    """`handled`, with one tenant's thread work done one piece at a time.

    A worker thread frees the loop but not the interpreter: each thread busy parsing or encoding takes its
    turn at the GIL with the loop, so a tenant sending four huge calls at once left every other tenant's
    RPC a fifth of the CPU (a `bash echo` went from 11 ms to 3 s at p99 in the fairness bench). In one lane
    per tenant, a flood of large calls holds at most one thread, and the loop keeps half the interpreter.
    """

    def __init__(self, width: int = 1) -> None:
        self._width = width
        self._lanes: dict[str, asyncio.Semaphore] = {}

    def _lane(self, tenant: str) -> asyncio.Semaphore:
        lane = self._lanes.get(tenant)
        if lane is None:
            lane = self._lanes[tenant] = asyncio.Semaphore(self._width)
        return lane

    async def handled(self, tenant: str, n: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if n < OFF_LOOP_BYTES:
            return fn(*args, **kwargs)
        async with self._lane(tenant):
            return await asyncio.to_thread(fn, *args, **kwargs)

    @contextlib.asynccontextmanager
    async def held(self, tenant: str) -> AsyncIterator[None]:
        """The tenant's lane around one piece of large-argument work done elsewhere (in the argument worker
        process: large_arguments). A tenant has at most `width` pieces running or queued at the worker, so
        another tenant's large call waits behind at most that many of its pieces, however many it sends."""
        async with self._lane(tenant):
            yield
