"""What a host's other calls see when an aborted call will not let go, and how much of a host's output the
agent holds: an abandoned call that ignores its abort leaves the host and the other calls alone, and a
result line over MAX_LINE_BYTES fails its own call without being held whole."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandbox_agent.custom import host as host_module
from sandbox_agent.custom.host import HostCallError, HostFile, ToolHost, _Lines
from tests.unit.custom.conftest import Sandbox, eventually


async def load(host: ToolHost, sandbox: Sandbox, path: str) -> None:
    await host.load([HostFile(path, "tool")], str(sandbox.project), str(sandbox.project))


async def test_an_abandoned_call_that_yields_leaves_the_host_alone(sandbox: Sandbox, py_host: ToolHost) -> None:
    path = sandbox.tool("calm.py", """
import asyncio
from pydantic import BaseModel
from opencode_tool import tool

state = {"counter": 0}

class NoArgs(BaseModel):
    pass

@tool(description="counts", args=NoArgs)
async def count(args: NoArgs, ctx) -> str:
    state["counter"] += 1
    return str(state["counter"])

@tool(description="ignores abort but yields", args=NoArgs)
async def stubborn(args: NoArgs, ctx) -> str:
    await ctx.metadata(title="stubborn")
    try:
        await asyncio.sleep(3)
    except asyncio.CancelledError:
        await asyncio.sleep(3)
    return "late"

@tool(description="waits", args=NoArgs)
async def patient(args: NoArgs, ctx) -> str:
    await asyncio.sleep(UNBLOCK)
    return "patient " + str(state["counter"])
""".replace("UNBLOCK", "2.5"))
    await load(py_host, sandbox, path)
    assert (await sandbox.call(py_host, "calm_count", {})).output == "1"
    abort = asyncio.Event()
    stubborn = asyncio.ensure_future(sandbox.call(py_host, "calm_stubborn", {}, abort=abort))
    await eventually(lambda: bool(sandbox.recorder.updates))
    patient = asyncio.ensure_future(sandbox.call(py_host, "calm_patient", {}))
    await asyncio.sleep(0.1)
    abort.set()
    with pytest.raises(HostCallError):
        await asyncio.wait_for(stubborn, 0.4)
    assert (await patient).output == "patient 1"
    assert py_host.restarts == 0


def test_lines_are_split_in_linear_time_and_an_oversized_one_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_module, "MAX_LINE_BYTES", 1000)
    lines: list[bytes] = []
    too_large: list[tuple[str | None, int]] = []
    split = _Lines(lines.append, lambda request_id, size: too_large.append((request_id, size)))
    long_line = [b'{"id":"2",', b'"type":"result","output":"' + b"y" * 600, b"y" * 600 + b'"}']
    split.feed(b'{"id":"1","type":"result"}\n' + long_line[0])
    split.feed(long_line[1])
    split.feed(long_line[2] + b'\n{"id":"3"')
    split.feed(b',"type":"result"}\n')
    assert lines == [b'{"id":"1","type":"result"}', b'{"id":"3","type":"result"}']
    assert too_large == [("2", sum(map(len, long_line)))]
    # Many small chunks of one long line cost linear time (each byte looked at once), not quadratic.
    monkeypatch.setattr(host_module, "MAX_LINE_BYTES", 64 * 1024 * 1024)
    big: list[bytes] = []
    split = _Lines(big.append, lambda *_: None)
    started = time.process_time()
    for _ in range(20_000):
        split.feed(b"x" * 1024)
    split.feed(b"\n")
    assert len(big[0]) == 20_000 * 1024
    assert time.process_time() - started < 5
