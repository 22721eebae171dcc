"""The control plane's side of per-call flow control on the agent's shared streams (sandbox_agent/output_credit.py).

One shared stream carries every command and tool call of a sandbox, and its reader must never wait on one call's
consumer (that would stall the others). So each call gets a window: the agent sends at most that many bytes of its
events ahead of what the call's consumer took, and the plane grants more as the consumer takes them (for the public
Exec: as each event goes to the client's gRPC stream, whose own flow control then holds a slow client). Output
the consumer does not take stays in the command's pipe, not in the plane.

The agent is inside the sandbox and may be hostile: the plane counts each call's queued bytes itself, and a call
the agent sends past its window is failed at once (its queued events dropped, its later ones ignored) instead of
growing the plane or blocking the stream.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from controlplane.errors import ControlPlaneError, SandboxError
from sandbox_agent.frames import MAX_PAYLOAD
from sandbox_agent.output_credit import charge

WINDOW = 1 << 20
"""Bytes of a call's events the agent may send ahead of its consumer: enough to keep a fast reader busy while
the grants travel, small next to what a plane holds for its many calls."""
GRANT_EVERY = WINDOW // 4
"""Taken bytes are granted back in batches of this much: one request up per 256 KiB, not per event."""
SLACK = 1 << 20
"""Queued bytes beyond the window an agent may leave before its next event (what the two sides count is the same:
a margin, never needed by an honest agent)."""
LARGEST_EVENT = {"ExecManyRequest": 1 << 20}
"""The biggest event an honest agent sends on each stream (an Exec's output comes in chunks of 64 KiB), the rest
up to the frame limit (a tool's result)."""


def largest_event(request_type: type[Any]) -> int:
    return LARGEST_EVENT.get(request_type.__name__, MAX_PAYLOAD)


class Overrun:
    """Put in a call's inbox in place of its events: the agent sent past the call's window."""

    def __init__(self, queued: int, size: int, window: int = WINDOW) -> None:
        self.queued = queued
        self.size = size
        self.window = window

    def error(self, sandbox_id: str) -> ControlPlaneError:
        return SandboxError(
            f"sandbox {sandbox_id}'s agent sent an event of {self.size} bytes for a call that already had {self.queued}"
            f" bytes queued, past its window of {self.window}: the call is failed (the agent ignores flow control)")


class CallWindow:
    """One call's bytes between the agent and its consumer."""

    def __init__(self, largest: int, window: int = WINDOW, grant_every: int = GRANT_EVERY) -> None:
        self._largest = largest
        self.window = window
        """The call's own (a tenant's budget may give a smaller one: controlplane.core.calls.output_budget)."""
        self._grant_every = grant_every
        self.queued = 0
        self._sizes: deque[int] = deque()
        """Each queued event's count, in the inbox's order."""
        self._taken = 0
        """Taken and not yet granted back."""

    def arrived(self, event: Any) -> Overrun | None:
        """Counts an event put in the inbox; an Overrun when the agent had no room for it."""
        size = charge(event)
        if self.queued >= self.window + SLACK or size > self._largest:
            return Overrun(self.queued, size, self.window)
        self.queued += size
        self._sizes.append(size)
        return None

    def took(self) -> int:
        """The consumer took the oldest queued event: the bytes to grant now (0: wait for a bigger batch)."""
        if not self._sizes:
            return 0
        size = self._sizes.popleft()
        self.queued -= size
        self._taken += size
        if self._taken < self._grant_every:
            return 0
        grant, self._taken = self._taken, 0
        return grant
