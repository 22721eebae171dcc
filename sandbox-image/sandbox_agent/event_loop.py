"""The event loop our server processes (the control plane, the agent) run on.

uvloop's loop does the same work as asyncio's in less CPU: a tool call is dozens of loop callbacks
(gRPC completion-queue wake-ups, handler steps, the tool's own tasks), and on a machine where the
control plane, the agent, the spawner and the command share two CPUs that CPU is the call's latency
(docs/performance.md). asyncio's loop remains where uvloop is not installed, and an operator can ask
for it with OCSB_EVENT_LOOP=asyncio.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

LOOP_VAR = "OCSB_EVENT_LOOP"
T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's default loop) when it is absent or not wanted."""
    choice = os.environ.get(LOOP_VAR, "uvloop")
    if choice == "asyncio":
        return None
    if choice != "uvloop":
        raise ValueError(f"{LOOP_VAR} must be 'uvloop' or 'asyncio', not {choice!r}")
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
