"""The control plane's side of a command's stdin flow control (sandbox_agent/stdin_credit.py): each call may have at
most a window of stdin sent to the agent and not yet credited back as written into the command's pipe. A writer
finding the window used up waits (for the public Exec: it stops reading the client's stream, and gRPC's own flow
control then holds the client), so a command that does not read its stdin costs the plane at most the window.

The agent is inside the sandbox and may be hostile: credit never takes a call below nothing sent, and an agent
that never credits only stalls that call's stdin (a writer waits on its own call, never on the stream). A call
that ends releases its waiting writer at once; what it would still send is dropped, as stdin to a finished
command always was.
"""

from __future__ import annotations

import asyncio

from sandbox_agent.stdin_credit import stdin_cost

STDIN_WINDOW = 1 << 20
"""Stdin bytes a call may have on their way to the command's pipe: enough to keep a command that reads fast busy
while the credits travel, small next to what a plane holds for its many calls."""

PIECE = 256 * 1024
"""The most of a client's stdin message sent to the agent at once: a client's 1 MiB messages would otherwise fill the
window one at a time, each waiting for the one before to be written and credited (half the throughput)."""


def pieces(data: bytes) -> list[bytes]:
    """`data` as the messages the agent gets (an empty message stays one: it is the client's to send)."""
    if len(data) <= PIECE:
        return [data]
    view = memoryview(data)
    return [bytes(view[at:at + PIECE]) for at in range(0, len(data), PIECE)]


class StdinWindow:
    """One call's stdin between the plane and the command's pipe."""

    def __init__(self) -> None:
        self.outstanding = 0
        """Sent (each message at its stdin_cost) and not yet credited."""
        self.ended = False
        """The call is over: nothing more will be credited, a writer no longer waits, what it still has goes
        nowhere."""
        self._room = asyncio.Event()
        self._room.set()

    async def spend(self, data: bytes) -> None:
        """Waits while the window is used up, then counts `data`. A message may end past the window (one is never
        split): the next one waits."""
        while not self.ended and self.outstanding >= STDIN_WINDOW:
            self._room.clear()
            await self._room.wait()
        self.outstanding += stdin_cost(data)

    def credit(self, size: int) -> None:
        self.outstanding = max(0, self.outstanding - size)
        if self.outstanding < STDIN_WINDOW:
            self._room.set()

    def release(self) -> None:
        """The call is over: a waiting writer goes on at once (and drops what it has)."""
        self.ended = True
        self._room.set()
