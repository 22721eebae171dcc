"""Per-call flow control on the shared streams (RunTools, ExecMany): the control plane grants each call a window
of bytes and tops it up as its consumer takes the call's events; a call whose window is used up waits before
its next event, so its command stops being read and blocks on write, as it would behind a slow terminal.

Without it one stream carries every call of a sandbox at the speed of its fastest reader: a command whose
caller does not read piles its output up in the control plane. The control plane counts the same bytes (the
agent may be hostile, see controlplane/sandbox/call_windows.py) and fails a call that ignores its window.
"""

from __future__ import annotations

import asyncio
from typing import Any

EVENT_COST = 256
"""Added to each event's encoded size: what holding even an empty event costs the reader, so a flood of tiny
events is bounded by the window as a flood of big ones is."""


def charge(event: Any) -> int:
    """What one event of the shared stream (ExecManyEvent, RunToolsEvent) counts against its call's window."""
    return int(event.ByteSize()) + EVENT_COST


class Credit:
    """One call's window. `window` 0: no limit (a control plane that grants none)."""

    def __init__(self, window: int) -> None:
        self._window = window
        self._outstanding = 0
        """Bytes sent and not yet granted back."""
        self._more = asyncio.Event()

    @property
    def limited(self) -> bool:
        return bool(self._window)

    def grant(self, size: int) -> None:
        self._outstanding = max(0, self._outstanding - size)
        self._more.set()

    def open_up(self) -> None:
        """The call is hung up: nobody will grant more, and what it still sends is dropped; it must not wait."""
        self._window = 0
        self._more.set()

    async def spend(self, size: int) -> None:
        """Waits while the window is used up, then counts an event of `size` bytes. An event may end past the
        window (one is never split; a tool's result may be bigger than the window): the next one waits."""
        while self._window and self._outstanding >= self._window:
            self._more.clear()
            await self._more.wait()
        self._outstanding += size


class Credits:
    """The windows of one shared stream's calls, by call number."""

    def __init__(self) -> None:
        self._calls: dict[int, Credit] = {}

    def open(self, call: int, window: int) -> None:
        self._calls[call] = Credit(window)

    def top_up(self, call: int, size: int) -> None:
        """More room for a call (a grant for one that already ended is late, not an error)."""
        credit = self._calls.get(call)
        if credit is not None:
            credit.grant(size)

    async def spend(self, call: int, event: Any) -> None:
        credit = self._calls.get(call)
        if credit is not None and credit.limited:
            await credit.spend(charge(event))

    def hang_up(self, call: int) -> None:
        credit = self._calls.get(call)
        if credit is not None:
            credit.open_up()

    def drop(self, call: int) -> None:
        self._calls.pop(call, None)
