"""How fast a sandbox sends a workspace copy: what decides that a copy holding one of the plane's copy turns while
another tenant waits for one is too slow to keep it (workspace_spool.fill gives it up then).

The criterion: while another tenant waits, a copy whose sandbox sent less than STALL_BYTES (1 MiB) in the last
STALL_S (10 s) of the time the copy waited on it is given up. Only the time spent waiting on the sandbox counts:
the plane's own writes of the pieces (its disk, slow on a loaded host) are not the sandbox's. A copy is judged
only once it has waited STALL_S on its sandbox, so a small workspace, sent whole in less, is never judged at all.

Why these figures. An honest agent's archiver is a tar of the workspace as it reads it, uncompressed, streamed as it
is made: it starts within a second (a helper process's start) and then sends at the speed of its disk and of
Python's tarfile. Measured on the 2-CPU build host at a load average of 10 (Docker, 310 MiB of 1,200 files of
256 KiB and 20,000 empty ones): 16 to 29 MiB a second of waiting on the agent, the first piece after 0.15 to
0.42 s, no wait for a piece longer than 0.42 s; 160 times the floor or more. A compromised agent that sends nothing,
one byte and then nothing, or one byte every 9 s (or every 0.5 s) sends less than 1 MiB in any 10 s, so it gives
up its turn within STALL_S of another tenant's arrival (at once if it was already that slow), where it held it for
FIRST_PIECE_WAIT_S (30 s), PIECE_WAIT_S (120 s) or, trickling, for good. A sender just above the floor still holds
a turn while others wait, for as long as its copy may grow: `limits.max_archive_expanded_bytes` (1 GiB) at
100 KiB/s is about 3 h. Raising the floor shortens that, and would start to catch honest copies on a slow disk.

Alone (no other tenant waiting) a copy is never judged by its pace: nobody waits for its turn, and a slow sandbox
then only waits out workspace_spool's PIECE_WAIT_S between pieces.
"""

from __future__ import annotations

from collections import deque

STALL_S = 10.0
"""The window a copy's pace is judged over (time spent waiting on its sandbox)."""
STALL_BYTES = 1 << 20
"""What a sandbox must send in any STALL_S while another tenant waits for a copy turn (100 KiB/s)."""


class Pace:
    """The pieces a copy's source sent, on the clock of the time the copy waited on it."""

    def __init__(self) -> None:
        self._waited = 0.0
        self._window: deque[tuple[float, int]] = deque()
        """(waited when it came, its bytes) of the pieces of the last STALL_S, oldest first."""
        self._in_window = 0

    def came(self, waited_s: float, size: int) -> None:
        """A wait on the source of `waited_s` that ended with a piece of `size` bytes."""
        self._waited += waited_s
        self._window.append((self._waited, size))
        self._in_window += size
        while self._window and self._window[0][0] <= self._waited - STALL_S:
            self._in_window -= self._window.popleft()[1]

    def sent(self, waiting_s: float) -> int:
        """The bytes of the last STALL_S, `waiting_s` into the current wait."""
        now = self._waited + waiting_s
        return sum(size for at, size in self._window if at > now - STALL_S)

    def slack(self, waiting_s: float) -> float:
        """How much longer the current wait (`waiting_s` in) may go on, if nothing more comes, before the copy has
        sent less than STALL_BYTES in its last STALL_S: 0 or less once it has."""
        now = self._waited + waiting_s
        # The window falls below the floor once it has lost every piece up to the first whose followers (with it)
        # stay under the floor; a piece that came at `at` leaves it at `at + STALL_S`.
        falls_at = STALL_S  # never judged before the copy has waited STALL_S on its source
        rest = self._in_window
        for at, size in self._window:
            if rest < STALL_BYTES:
                break
            rest -= size
            falls_at = max(falls_at, at + STALL_S)
        return falls_at - now
