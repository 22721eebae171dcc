"""What the client's wait for the server's `ocsb-accepted` header costs (controlplane/stream_accept.py).

The client library writes nothing on a request stream before the server's accept header has arrived, so that
an authentication refusal reaches it exactly (UNAUTHENTICATED, not a local INTERNAL from a write after the
end). This section times an ExecuteTool `read` round trip of a small file with that wait, beside the same call
with the wait skipped inside this process only (the server still sends the header; nothing else changes), in
alternating blocks so both see the same machine.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

from controlplane import client as client_module
from tests.bench.bench import cleanup
from tests.bench.bench_common import BENCH_FILE, BENCH_TEXT, Row
from tests.bench.bench_plane import Plane, start_plane

WAIT = "accepted"
"""The client module's name for stream_accept.accepted, which its request generators await."""
BLOCK = 25
"""Calls per block; the modes alternate block by block."""


@contextlib.contextmanager
def without_accept_wait() -> Iterator[None]:
    """The client writes its first request at once, as it did before the handshake existed."""
    waiting = getattr(client_module, WAIT)

    async def at_once(_: Any) -> bool:
        return True

    setattr(client_module, WAIT, at_once)
    try:
        yield
    finally:
        setattr(client_module, WAIT, waiting)


async def read_once(p: Plane, session_id: str) -> float:
    started = time.perf_counter()
    out = await p.client.execute_tool(session_id, "read", {"filePath": BENCH_FILE})
    took = (time.perf_counter() - started) * 1000
    if "1: line 1:" not in out.output:
        raise RuntimeError(f"read answered {out.output[:200]!r} {out.error!r}")
    return took


async def section(quick: bool) -> list[str]:
    blocks = 4 if quick else 12
    instance = f"bench-acc-{secrets.token_hex(3)}"
    notes: list[str] = []
    planes: list[Plane] = []
    p = await start_plane(instance, 0)
    planes.append(p)
    try:
        session = await p.client.create_session()
        await p.client.run(session.id, ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", BENCH_TEXT, BENCH_FILE])
        for _ in range(10):  # warm-up, both ways
            await read_once(p, session.id)
            with without_accept_wait():
                await read_once(p, session.id)
        waited: list[float] = []
        direct: list[float] = []
        for _ in range(blocks):
            waited += [await read_once(p, session.id) for _ in range(BLOCK)]
            with without_accept_wait():
                direct += [await read_once(p, session.id) for _ in range(BLOCK)]
        await p.client.delete_session(session.id)
    finally:
        await cleanup([instance], planes, [p.data_dir], notes)
    with_wait, without = Row("read, waiting for the accept header", waited), Row("read, wait skipped", direct)
    lines = [f"ExecuteTool read round trip, {len(waited)} calls each way in alternating blocks of {BLOCK}:"]
    for row in (with_wait, without):
        lines.append(f"  {row.name:38} p50 {row.p50:7.3f} ms  p99 {row.p99:7.3f} ms")
    cost_p50, cost_p99 = with_wait.p50 - without.p50, with_wait.p99 - without.p99
    lines.append(f"  cost of the wait: p50 {cost_p50:+.3f} ms, p99 {cost_p99:+.3f} ms")
    return lines + [f"  {n}" for n in notes if "STILL LEFT" in n]
