"""Flow control of a command's stdin on the ExecMany stream: the agent writes each call's stdin into its pipe as the
command reads it, and credits the control plane with what it wrote, so the plane sends at most a window ahead
(controlplane/sandbox/stdin_windows.py).

Without it the plane put every stdin message on the shared stream as it came, and a command that does not read
(`sleep 600`) left all of a client's stream in the plane's outbox and the agent's inbox: gigabytes in seconds.
Here the agent holds what the plane sent ahead of the pipe (at most the window), and an abort does not wait
behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from sandbox.v1 import agent_pb2
from sandbox_agent.rpc_status import RequestsLostError

FEATURES = ("output-credit", "stdin-credit")
"""What this agent advertises in Health (`flow_control`) and on the first message of each shared stream (`features`):
the control plane uses no agent that names less (controlplane/sandbox/agent_protocol.py)."""
MESSAGE_COST = 256
"""Added to each stdin message's data in the window: holding even an empty message costs the plane and the agent
something, so a flood of tiny messages is bounded by the window as a flood of big ones is."""
CREDIT_EVERY = 256 * 1024
"""Credit is sent once this much was written, or when the agent has nothing of the call's stdin left to write:
one message down per 256 KiB of a fast stream, and at once for a slow one."""


def stdin_cost(data: bytes) -> int:
    """What one stdin message counts against its call's window, on both sides."""
    return len(data) + MESSAGE_COST


class Stdin(Protocol):
    """A running command's stdin (process.Execution)."""

    async def write_stdin(self, data: bytes) -> None: ...

    def close_stdin(self) -> None: ...

    def stop(self, *, reason: str, timed_out: bool = False) -> asyncio.Task[None]: ...


async def feed(requests: AsyncIterator[agent_pb2.ExecRequest], execution: Stdin, credit: Callable[[int], None]) -> None:
    """Carries a command's later requests to it: stdin and its close in order through the pipe (credited as
    written), an abort at once, even while stdin waits on a command that does not read. Runs until cancelled
    (the call's end)."""
    pending: deque[bytes | None] = deque()
    """Stdin not yet written, in order; None: close it there."""
    more = asyncio.Event()

    async def write() -> None:
        owed = 0
        while True:
            if not pending:
                if owed:
                    credit(owed)
                    owed = 0
                more.clear()
                await more.wait()
                continue
            data = pending.popleft()
            if data is None:
                execution.close_stdin()
                continue
            await execution.write_stdin(data)  # returns at once when stdin is closed: the data is dropped
            owed += stdin_cost(data)
            if owed >= CREDIT_EVERY:
                credit(owed)
                owed = 0

    writer = asyncio.ensure_future(write())
    try:
        with contextlib.suppress(RequestsLostError, asyncio.InvalidStateError):
            async for request in requests:
                kind = request.WhichOneof("msg")
                if kind == "stdin":
                    pending.append(request.stdin)
                    more.set()
                elif kind == "close_stdin":
                    pending.append(None)
                    more.set()
                elif kind == "abort":
                    execution.stop(reason=request.abort.reason or "aborted")
        await writer  # what came before the requests ended still goes in
    finally:
        writer.cancel()
