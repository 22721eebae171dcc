"""What custom tools and plugins print reaches their authors through every path, with real Bun, the real
`@opencode-ai/plugin` and a real sandbox: ListTools (load time), the ExecuteTool stream (before the result),
the bus (`tool.log`, and the recent lines a subscriber asks for), span events, `controlplane logs`, and the
bounds a tool printing in a loop meets."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys

import pytest
from opentelemetry import trace

from controlplane import cli_logs
from tests.archives import tar_of
from tests.docker.test_tracing_sandbox import spans_of
from tests.planes import Plane, workspace_session
from tests.tracing import memory_exporter

pytestmark = pytest.mark.docker

# The control plane adds its tracing interceptor only when an SDK provider exists as its server is built.
memory_exporter()
tracer = trace.get_tracer("tests.docker.test_tool_logs_sandbox")

CHATTY_TS = """import { tool } from "@opencode-ai/plugin"

console.log("chatty loaded", { version: 3 })

export default tool({
  description: "Prints while it works",
  args: { n: tool.schema.number() },
  async execute(args) {
    console.info(`working on ${args.n}`)
    console.warn("almost done")
    return String(args.n * 2)
  },
})
"""
QUIET_PLUGIN_TS = """import type { Plugin } from "@opencode-ai/plugin"

export const Quiet: Plugin = async () => {
  console.warn("quiet: disabled, no API key set")
  return {}
}
"""
FLOOD_TS = """import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Prints in a loop",
  args: {},
  async execute() {
    for (let i = 0; i < 50000; i++) console.log(`line ${i} ` + "x".repeat(200))
    return "flooded"
  },
})
"""
TOOL = "/workspace/.opencode/tool"

session_id = workspace_session({
    ".opencode/tool/chatty.ts": CHATTY_TS,
    ".opencode/tool/flood.ts": FLOOD_TS,
    ".opencode/plugin/quiet.ts": QUIET_PLUGIN_TS,
})


async def test_load_time_output_is_in_the_listing(docker_plane: Plane, session_id: str) -> None:
    listing = await docker_plane.client.list_tools(session_id)
    assert [(line.origin, line.level, line.text, line.call_id) for line in listing.logs] == [
        (f"{TOOL}/chatty.ts", "info", "chatty loaded { version: 3 }", ""),
        ("/workspace/.opencode/plugin/quiet.ts", "warn", "quiet: disabled, no API key set", ""),
    ]
    assert all(line.at > 0 for line in listing.logs)


async def test_call_output_comes_on_the_stream_before_the_result(docker_plane: Plane, session_id: str) -> None:
    outcome = await docker_plane.client.execute_tool(session_id, "chatty", {"n": 21}, call_id="call_chatty")
    assert outcome.output == "42"
    kinds = [e.WhichOneof("event") for e in outcome.events]
    logs = [e.log for e in outcome.events if e.WhichOneof("event") == "log"]
    assert [(line.origin, line.level, line.text, line.call_id) for line in logs] == [
        (f"{TOOL}/chatty.ts", "info", "working on 21", "call_chatty"),
        (f"{TOOL}/chatty.ts", "warn", "almost done", "call_chatty"),
    ]
    assert kinds.index("result") > max(i for i, kind in enumerate(kinds) if kind == "log")
    # The model's answer holds none of it.
    assert "working" not in outcome.output


async def test_call_output_is_on_the_bus_and_held_for_later(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    events = client.subscribe_events(session_id)
    received: list[dict[str, object]] = []

    async def collect() -> None:
        async for event in events:
            if event.type == "tool.log":
                received.append(json.loads(event.properties_json))
                if len(received) == 2:
                    return

    collecting = asyncio.ensure_future(collect())
    await asyncio.sleep(0.3)
    assert (await client.execute_tool(session_id, "chatty", {"n": 1}, call_id="call_bus")).output == "2"
    await asyncio.wait_for(collecting, 10)
    events.cancel()
    assert [(p["callID"], p["tool"], p["level"], p["text"]) for p in received] == [
        ("call_bus", "chatty", "info", "working on 1"), ("call_bus", "chatty", "warn", "almost done"),
    ]
    # A subscriber that comes later asks for the recent lines first.
    later = client.subscribe_events(session_id, recent_logs=True)
    replayed: list[str] = []
    async for event in later:
        replayed.append(json.loads(event.properties_json)["text"])
        if replayed[-2:] == ["working on 1", "almost done"]:
            break
    later.cancel()
    assert "chatty loaded { version: 3 }" in replayed


async def test_lines_are_span_events_of_init_and_execute(docker_plane: Plane) -> None:
    client = docker_plane.client
    with tracer.start_as_current_span("test root") as root:
        session = await client.create_session(workspace_archive=tar_of({".opencode/tool/chatty.ts": CHATTY_TS}))
        try:
            await client.list_tools(session.id)
            assert (await client.execute_tool(session.id, "chatty", {"n": 2}, call_id="call_span")).output == "4"
        finally:
            await client.delete_session(session.id)
    spans = await spans_of(root.get_span_context().trace_id, "init_tool chatty", "execute_tool chatty")
    init = next(s for s in spans if s.name == "init_tool chatty" and "sandbox.process" in s.resource.attributes)
    assert [(e.name, dict(e.attributes or {})) for e in init.events if e.name == "log"] == [
        ("log", {"log.level": "info", "log.text": "chatty loaded { version: 3 }"}),
    ]
    execute = next(s for s in spans if s.name == "execute_tool chatty")
    assert [dict(e.attributes or {}) for e in execute.events if e.name == "log"] == [
        {"log.level": "info", "log.origin": f"{TOOL}/chatty.ts", "log.text": "working on 2"},
        {"log.level": "warn", "log.origin": f"{TOOL}/chatty.ts", "log.text": "almost done"},
    ]


async def test_a_tool_printing_in_a_loop_is_bounded(docker_plane: Plane, session_id: str) -> None:
    outcome = await docker_plane.client.execute_tool(session_id, "flood", {}, call_id="call_flood")
    assert outcome.output == "flooded"
    logs = [e.log for e in outcome.events if e.WhichOneof("event") == "log"]
    assert sum(len(line.text) for line in logs) <= 64 * 1024 + 100
    assert logs[-1].text.endswith("more log lines dropped]")
    assert int(logs[-1].text.split()[0][1:]) > 40000


async def test_controlplane_logs_prints_recent_lines_then_follows(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    out = io.StringIO()
    following = asyncio.ensure_future(cli_logs.follow(client, session_id, out))
    await asyncio.sleep(0.5)
    assert "chatty loaded { version: 3 }" in out.getvalue()
    assert (await client.execute_tool(session_id, "chatty", {"n": 5}, call_id="call_cli")).output == "10"
    for _ in range(100):
        if "[call_cli] working on 5" in out.getvalue():
            break
        await asyncio.sleep(0.05)
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    assert f"WARN  {TOOL}/chatty.ts [call_cli] almost done" in out.getvalue()


async def test_controlplane_logs_ends_quietly_on_ctrl_c(docker_plane: Plane, session_id: str) -> None:
    await docker_plane.client.list_tools(session_id)  # the load-time lines are held from the first listing on
    env = {**os.environ, "CONTROLPLANE_TARGET": docker_plane.plane.address, "CONTROLPLANE_TOKEN": docker_plane.token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controlplane.cli", "logs", session_id, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    first = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert b"chatty loaded" in first or b"quiet" in first
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 130, err  # 128 + SIGINT, as every command of the CLI ends on Ctrl-C
    assert b"Traceback" not in err
