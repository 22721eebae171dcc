"""Reading the agent's frames with a deadline per frame: once a frame has begun, all of it must arrive in time.

The agent is inside the sandbox and may be hostile: one that announces a 64 MiB frame and then sends a byte a
second would otherwise hold the sandbox's shared stream (and every later call on it) forever. An idle stream
between frames is normal (no call is running) and has no deadline.
"""

from __future__ import annotations

import asyncio

from sandbox_agent.frames import HEADER, MESSAGE, OPEN, STATUS, StreamCutError, parse_header

FRAME_DEADLINE_S = 30.0
"""From a frame's first byte to its last. An honest agent writes a whole frame at once (64 MiB at most, well under
a second over a local socket even when starved of CPU); only a stalled or hostile agent takes this long."""


async def read_frame_in_time(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """As sandbox_agent.frames.read_frame, with FRAME_DEADLINE_S for each frame once its first byte arrived."""
    try:
        first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return None
    deadline = FRAME_DEADLINE_S
    try:
        async with asyncio.timeout(deadline):
            header = first + await reader.readexactly(HEADER.size - 1)
            size, kind = parse_header(header, (OPEN, MESSAGE, STATUS))  # an agent sends no END
            return kind, await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise StreamCutError("the stream ended inside a frame") from exc
    except TimeoutError as exc:
        # A frame that began and did not end in time: the stream is as good as cut (UNAVAILABLE above).
        raise StreamCutError(f"a frame did not arrive whole within {deadline:g} s of its start") from exc
