"""What bounds the plane's memory for an agent that honours no output window (an older image, or one that says
nothing of what it honours: agent_streams.py learns that from the stream's first message).

Such an agent cannot be asked to hold one call's events, and failing the call past the window would fail honest
calls of an older image. So the stream's reader itself waits while one call has HOLD bytes queued unread: the
agent's stream is then not read, its own flow control holds the agent, and every call of that sandbox pauses
until the consumer takes some. Only that sandbox waits (its agent chose this); the plane holds at most HOLD a call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from sandbox_agent.output_credit import charge

HOLD = 8 << 20
"""Bytes of one call's events queued before the reader waits: room for an honest consumer's bursts."""


class HeldOutput:
    """Each call's queued bytes on a stream without windows, and the reader's wait for room."""

    def __init__(self) -> None:
        self._sizes: dict[int, deque[int]] = {}
        self._queued: dict[int, int] = {}
        self._taken = asyncio.Event()
        self._closed = False

    async def arrived(self, call: int, event: Any) -> None:
        """Counts an event put in the call's inbox; waits while the call holds HOLD bytes or more."""
        size = charge(event)
        self._sizes.setdefault(call, deque()).append(size)
        self._queued[call] = self._queued.get(call, 0) + size
        while not self._closed and self._queued.get(call, 0) >= HOLD:
            self._taken.clear()
            await self._taken.wait()

    def took(self, call: int) -> int:
        """The consumer took the call's oldest event: its size, to grant back (an agent of the image before the
        hello honours the window it was given at the start, and waits for these grants)."""
        sizes = self._sizes.get(call)
        if not sizes:
            return 0
        size = sizes.popleft()
        self._queued[call] -= size
        self._taken.set()
        return size

    def drop(self, call: int) -> None:
        """The call is forgotten: its queue no longer counts (a reader waiting on it goes on)."""
        self._sizes.pop(call, None)
        self._queued.pop(call, None)
        self._taken.set()

    def close(self) -> None:
        """The stream is closed: its reader must not wait on a consumer any more."""
        self._closed = True
        self._taken.set()
