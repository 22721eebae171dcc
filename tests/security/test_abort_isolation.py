"""Abort stays with its call: aborting one custom-tool call that ignores `ctx.abort` ends that call at once
and leaves the session's other calls and the host's module state alone (issue 21, item 7).

A model can abort calls at will (its client cancels them); before, the host was restarted half a second
after such an abort, failing every other running call of the session and resetting every tool's module
state. Both hosts (Bun, Python) are driven the same way; each case runs on a real sandbox.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import tool_pb2
from tests.archives import tar_of
from tests.planes import Plane

pytestmark = pytest.mark.docker

ABORTED = "Tool execution aborted"
ABORT_GRACE_S = 0.5
"""The driver's grace for an aborted call (sandbox_agent.custom.host.ABORT_GRACE_S)."""

STATE_TS = """import { tool } from "@opencode-ai/plugin"

let counter = 0

export const count = tool({
  description: "Counts its calls in module state",
  args: {},
  async execute() {
    counter += 1
    return `count ${counter} pid ${process.pid}`
  },
})

// Most real tools never look at ctx.abort.
export const stubborn = tool({
  description: "Ignores abort",
  args: {},
  async execute(_args, ctx) {
    ctx.metadata({ title: "running" })
    await Bun.sleep(3000)
    return "stubborn finished"
  },
})

// Starts a child and waits for it, ignoring abort: the child must not outlive the abandoned call.
export const parent = tool({
  description: "Waits for a child process",
  args: {},
  async execute(_args, ctx) {
    const child = Bun.spawn(["sleep", "60"])
    ctx.metadata({ title: "running", metadata: { child: child.pid } })
    await child.exited
    return "child ended"
  },
})

export const patient = tool({
  description: "Runs for a while, then reports the counter",
  args: {},
  async execute(_args, ctx) {
    ctx.metadata({ title: "running" })
    await Bun.sleep(1500)
    return `patient done, count ${counter}`
  },
})
"""

PYSTATE_PY = '''import os
import subprocess
import time

from opencode_tool import tool

counter = 0
NO_ARGS = {"type": "object", "properties": {}}


async def _count(args, ctx):
    global counter
    counter += 1
    return f"count {counter} pid {os.getpid()}"


def _stubborn(args, ctx):
    # A synchronous tool runs in a worker thread, which nothing can interrupt.
    ctx.metadata_sync(title="running")
    time.sleep(3)
    return "stubborn finished"


def _parent(args, ctx):
    # Starts a child and waits for it, ignoring abort: the child must not outlive the abandoned call.
    child = subprocess.Popen(["sleep", "60"])
    ctx.metadata_sync(title="running", metadata={"child": child.pid})
    child.wait()
    return "child ended"


def _patient(args, ctx):
    ctx.metadata_sync(title="running")
    time.sleep(1.5)
    return f"patient done, count {counter}"


count = tool(description="Counts its calls in module state", args=NO_ARGS, execute=_count)
stubborn = tool(description="Ignores abort", args=NO_ARGS, execute=_stubborn)
patient = tool(description="Runs for a while, then reports the counter", args=NO_ARGS, execute=_patient)
parent = tool(description="Waits for a child process", args=NO_ARGS, execute=_parent)
'''


@dataclass(frozen=True)
class Host:
    name: str
    prefix: str


HOSTS = [Host("bun", "state"), Host("python", "pystate")]


@pytest.fixture(scope="module")
async def session_id(docker_plane: Plane) -> AsyncIterator[str]:
    files = {".opencode/tool/state.ts": STATE_TS, ".opencode/tool/pystate.py": PYSTATE_PY}
    session = await docker_plane.client.create_session(workspace_archive=tar_of(files))
    yield session.id
    await docker_plane.client.delete_session(session.id)


Outbox = asyncio.Queue[tool_pb2.ExecuteToolRequest | None]


async def _start(client: AsyncClient, session_id: str, tool: str, call_id: str) -> tuple[
        Outbox, AsyncIterator[tool_pb2.ToolEvent]]:
    """A raw call, returned once its tool reported that it runs."""
    stream, outbox = client.tool_call(session_id, tool, {}, call_id=call_id)
    events = stream.__aiter__()
    async for event in events:
        if event.WhichOneof("event") == "metadata" and event.metadata.title == "running":
            return outbox, events
        assert event.WhichOneof("event") == "state", event
    raise AssertionError(f"{tool} ended before it ran")


async def _final(events: AsyncIterator[tool_pb2.ToolEvent]) -> tool_pb2.ToolEvent:
    async for event in events:
        if event.WhichOneof("event") in ("result", "error"):
            return event
    raise AssertionError("the call ended without a result or an error")


async def _count(client: AsyncClient, session_id: str, host: Host) -> tuple[int, str]:
    outcome = await client.execute_tool(session_id, f"{host.prefix}_count", {})
    assert outcome.error is None, outcome.error
    _, number, _, pid = outcome.output.split()
    return int(number), pid


@pytest.mark.parametrize("host", HOSTS, ids=[h.name for h in HOSTS])
async def test_an_aborted_call_that_ignores_abort_leaves_the_others_alone(
    docker_plane: Plane, session_id: str, host: Host,
) -> None:
    client = docker_plane.client
    before, pid = await _count(client, session_id, host)
    patient_box, patient_events = await _start(client, session_id, f"{host.prefix}_patient", f"p-{host.name}")
    stubborn_box, stubborn_events = await _start(client, session_id, f"{host.prefix}_stubborn", f"s-{host.name}")

    aborted_at = time.monotonic()
    stubborn_box.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="user pressed stop")))
    stopped = await asyncio.wait_for(_final(stubborn_events), 10)
    ended_after = time.monotonic() - aborted_at
    stubborn_box.put_nowait(None)
    # Ended for the client at once (not after the grace, nor when the tool finishes), with upstream's text:
    # the host was not restarted, so there is nothing more to say.
    assert (stopped.WhichOneof("event"), stopped.error.message) == ("error", ABORTED)
    assert ended_after < ABORT_GRACE_S, ended_after

    # The concurrent call ends normally and saw the module state of before.
    finished = await asyncio.wait_for(_final(patient_events), 10)
    patient_box.put_nowait(None)
    assert finished.WhichOneof("event") == "result", finished
    assert finished.result.output == f"patient done, count {before}"

    # Same host process, same module state.
    assert await _count(client, session_id, host) == (before + 1, pid)
    # The abandoned call's late answer (when its sleep ends) is dropped and disturbs nothing.
    await asyncio.sleep(3.2)
    assert await _count(client, session_id, host) == (before + 2, pid)


@pytest.mark.parametrize("host", HOSTS, ids=[h.name for h in HOSTS])
async def test_a_lone_stubborn_call_restarts_the_host_and_its_error_says_so(
    docker_plane: Plane, session_id: str, host: Host,
) -> None:
    client = docker_plane.client
    _, pid = await _count(client, session_id, host)
    box, events = await _start(client, session_id, f"{host.prefix}_stubborn", f"lone-{host.name}")
    box.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="stop")))
    stopped = await asyncio.wait_for(_final(events), 10)
    box.put_nowait(None)
    assert stopped.error.message == (
        f"{ABORTED} (the tool did not stop within 0.5 s and nothing else was running in the {host.name} tool "
        "host, so the host was restarted: its tools' module state was reset)"
    )
    number, new_pid = await _count(client, session_id, host)
    assert (number, new_pid != pid) == (1, True)


@pytest.mark.parametrize("host", HOSTS, ids=[h.name for h in HOSTS])
async def test_an_abandoned_call_does_not_leave_its_children_running(
    docker_plane: Plane, session_id: str, host: Host,
) -> None:
    client = docker_plane.client
    patient_box, patient_events = await _start(client, session_id, f"{host.prefix}_patient", f"pc-{host.name}")
    stream, outbox = client.tool_call(session_id, f"{host.prefix}_parent", {}, call_id=f"parent-{host.name}")
    events = stream.__aiter__()
    child = 0
    async for event in events:
        if event.WhichOneof("event") == "metadata":
            child = json.loads(event.metadata.metadata_json)["child"]
            break
    assert child > 0
    assert (await client.run(session_id, ["kill", "-0", str(child)])).exit_code == 0
    outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="stop")))
    stopped = await asyncio.wait_for(_final(events), 10)
    outbox.put_nowait(None)
    assert stopped.error.message == ABORTED  # abandoned: the patient call runs in the same host
    # Killed once the grace is over (the host tracks the children each call started).
    deadline = time.monotonic() + 3
    while (await client.run(session_id, ["kill", "-0", str(child)])).exit_code == 0:
        assert time.monotonic() < deadline, "the abandoned call's child is still running"
        await asyncio.sleep(0.1)
    finished = await asyncio.wait_for(_final(patient_events), 10)
    patient_box.put_nowait(None)
    assert finished.WhichOneof("event") == "result", finished
