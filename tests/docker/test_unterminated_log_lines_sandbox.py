"""A tool that writes tens of MiB with no newline (to print/sys.stdout/sys.stderr in Python, console.log or
process.stdout in TypeScript) in a real sandbox: the call ends promptly with its result, what reaches the
author stays within the call's log budget, and the session's next call is not held up by leftover work."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

MIB = 1024 * 1024
CALL_BOUND_S = 20.0
"""Generous for a loaded two-core machine: the work is linear, well under a second per 50 MiB."""
NEXT_CALL_BOUND_S = 5.0

NONL_PY = '''import sys

from opencode_tool import tool


@tool(description="Writes 50 MiB with no newline", args={"type": "object", "properties": {}})
async def default(args, ctx):
    # An async tool runs on the host's event loop: a write that costs more than linear time blocks every call.
    print("x" * (50 * 1024 * 1024), end="")
    return "py done"
'''
NONL_SYNC_PY = '''import sys

from opencode_tool import tool


@tool(description="Writes 50 MiB to stderr, no newline", args={"type": "object", "properties": {}})
def default(args, ctx):
    # A synchronous tool runs in a worker thread, which nothing can stop once the call is cancelled.
    sys.stderr.write("y" * (50 * 1024 * 1024))
    return "py sync done"
'''
QUICK_PY = '''from opencode_tool import tool


@tool(description="Answers at once", args={"type": "object", "properties": {}})
async def default(args, ctx):
    return "py quick"
'''
NONL_TS = """import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Writes 100 MiB to console.log and 50 MiB to process.stdout, no newline",
  args: {},
  async execute() {
    console.log("x".repeat(100 * 1024 * 1024))
    process.stdout.write("y".repeat(50 * 1024 * 1024))
    return "ts done"
  },
})
"""
QUICK_TS = """import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Answers at once",
  args: {},
  async execute() {
    return "ts quick"
  },
})
"""

session_id = workspace_session({
    ".opencode/tools/nonl.py": NONL_PY,
    ".opencode/tools/nonl_sync.py": NONL_SYNC_PY,
    ".opencode/tools/quick_py.py": QUICK_PY,
    ".opencode/tools/nonl_ts.ts": NONL_TS,
    ".opencode/tools/quick_ts.ts": QUICK_TS,
})


@pytest.mark.parametrize(("tool", "output", "quick", "quick_output", "least_dropped"), [
    ("nonl", "py done", "quick_py", "py quick", 6000),
    ("nonl_sync", "py sync done", "quick_py", "py quick", 6000),
    ("nonl_ts", "ts done", "quick_ts", "ts quick", 0),
])
async def test_a_long_write_with_no_newline_ends_promptly_and_bounded(
    docker_plane: Plane, session_id: str, tool: str, output: str, quick: str, quick_output: str,
    least_dropped: int,
) -> None:
    client = docker_plane.client
    await client.list_tools(session_id)
    started = time.monotonic()
    outcome = await asyncio.wait_for(client.execute_tool(session_id, tool, {}, call_id=f"call_{tool}"), CALL_BOUND_S)
    took = time.monotonic() - started
    assert outcome.output == output, outcome
    assert took < CALL_BOUND_S
    logs = [e.log for e in outcome.events if e.WhichOneof("event") == "log"]
    assert sum(len(line.text) for line in logs) <= 64 * 1024 + 200
    assert all(len(line.text) <= 8 * 1024 + 64 for line in logs)
    if least_dropped:
        # Every 8 KiB piece past the budget is counted, so the author learns how much was lost.
        assert logs[-1].text.endswith("more log lines dropped]")
        assert int(logs[-1].text.split()[0][1:]) >= least_dropped
    started = time.monotonic()
    quick_outcome = await asyncio.wait_for(client.execute_tool(session_id, quick, {}), NEXT_CALL_BOUND_S)
    assert quick_outcome.output == quick_output
    assert time.monotonic() - started < NEXT_CALL_BOUND_S


async def test_a_cancelled_long_write_does_not_hold_up_the_next_call(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    await client.list_tools(session_id)
    # The client gives up early, most often while the host is still writing (the fixed write takes about a
    # second on a loaded machine, the quadratic one minutes): the write must end by itself soon after, as the
    # host serves every call of the session (an async tool's write runs on its one event loop).
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.execute_tool(session_id, "nonl", {}), 0.3)
    started = time.monotonic()
    quick_outcome = await asyncio.wait_for(client.execute_tool(session_id, "quick_py", {}), NEXT_CALL_BOUND_S)
    assert quick_outcome.output == "py quick"
    assert time.monotonic() - started < NEXT_CALL_BOUND_S
