"""The handshake that keeps an authentication refusal exact on streams the client writes to.

A client that writes to a request stream the server has already ended sees its own write fail, and
grpc then reports that failure (INTERNAL, "Internal error from Core") instead of the server's status:
a refused token looked like a server fault. So the server opens every request stream it accepts by
sending this header before its handler reads anything, and the client library writes nothing until
the header is there; without it the call was refused, and the client only waits for the status.
"""

from __future__ import annotations

import asyncio
from typing import Any

ACCEPTED_KEY = "ocsb-accepted"
ACCEPTED: tuple[tuple[str, str], ...] = ((ACCEPTED_KEY, "1"),)


async def accepted(call: Any) -> bool:
    """Whether the server accepted `call` (a grpc.aio stream-request call); when it did not, returns once
    the call has its final status, so that nothing is written after it."""
    metadata = await call.initial_metadata()
    if any(key == ACCEPTED_KEY for key, _ in metadata or ()):
        return True
    await call.code()
    return False


async def ended(call: Any) -> bool:
    """Whether the server has ended `call`, asked before each later write: a server may end an accepted stream at
    any time (its token revoked), and a write that meets the end is reported as a local INTERNAL, hiding the
    server's status. The loop turns first, so that a status already received is seen."""
    for _ in range(3):
        await asyncio.sleep(0)
    return bool(call.done())
