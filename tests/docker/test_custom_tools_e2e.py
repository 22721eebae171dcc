"""Custom tools and project plugins end to end through the public gRPC API and a real sandbox: aborts,
busy loops, plugin hooks, re-scans and real-world tool files (the operator's global tools dir is
test_custom_tools_global_dir.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.client import AsyncClient, ToolOutcome, allow_once
from controlplane.v1 import tool_pb2
from tests.archives import tar_of
from tests.docker.custom_tools_support import ECHO_TS, custom_tools
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker


ABORTED = "Tool execution aborted"
ABORTED_WITH_RESTART = (ABORTED + " (the tool did not stop within 0.5 s and nothing else was running in the bun tool "
                        "host, so the host was restarted: its tools' module state was reset)")
TOOL_DIR = "/workspace/.opencode/tool"

WAITER_TS = """import { tool } from "@opencode-ai/plugin"
import { writeFileSync } from "node:fs"

export default tool({
  description: "Waits until the call is aborted, then leaves a marker file",
  args: { marker: tool.schema.string() },
  async execute(args, ctx) {
    const fired = new Promise((resolve) => ctx.abort.addEventListener("abort", resolve))
    ctx.metadata({ title: "waiting" })
    await fired
    writeFileSync(args.marker, `${ctx.abort.aborted} ${ctx.abort.reason}`)
    return "noticed the abort"
  },
})
"""
SPIN_TS = """import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Never yields once it started",
  args: {},
  async execute(_args, ctx) {
    ctx.metadata({ title: "spinning" })
    await new Promise((resolve) => setTimeout(resolve, 20))  // lets the metadata line out first
    while (true) {}
  },
})
"""


PLUGIN_TS = """import { tool } from "@opencode-ai/plugin"

export const Rewriter = async ({ directory, worktree }) => ({
  tool: {
    plug_echo: tool({
      description: "Echoes from a project plugin",
      args: { text: tool.schema.string() },
      async execute(args, ctx) {
        return `plugin says ${args.text} (dir=${directory} tree=${worktree} agent=${ctx.agent})`
      },
    }),
  },
  "tool.execute.before": async (input, output) => {
    if (input.tool === "bash" && output.args.command === "echo original") output.args.command = "echo rewritten"
  },
  "tool.execute.after": async (input, output) => {
    if (input.tool === "bash") output.title = `after(${input.tool}): ${output.title}`
  },
})
"""
BROKEN_PLUGIN_TS = """export const Exploder = async () => { throw new Error("plugin exploded at load") }
"""

# Real-world tool files: what OpenCode users write beyond the documented minimum.
FORECAST_TS = """import { tool } from "@opencode-ai/plugin/tool"
import { z } from "zod"

export default tool({
  description: "Forecast for a city",
  args: z.object({ city: z.string().describe("City name"), days: z.number().default(3) }),
  async execute(args) {
    return { city: args.city, days: args.days }
  },
})
"""
LINES_TS = """export function countLines(text: string): number {
  return text.split("\\n").length
}
"""
HELPERS_TS = """export const SEPARATOR = "\\n"
export function join(parts: string[]): string { return parts.join(SEPARATOR) }
"""
COUNT_TS = """import { tool } from "@opencode-ai/plugin"
import { countLines } from "./lib/lines.js"
import { join } from "./helpers"

export default tool({
  description: "Counts the lines of some parts joined",
  args: { parts: tool.schema.array(tool.schema.string()) },
  async execute(args, ctx) {
    await ctx.metadata({ metadata: { cwd: process.cwd() } })
    return countLines(join(args.parts))
  },
})
"""
DB_TS = """import { Database } from "bun:sqlite"
import { tool } from "@opencode-ai/plugin"

const db = new Database(":memory:")
db.run("create table kv (k text primary key, v text)")

const search = tool({
  description: "Stores a value and reads it back from SQLite",
  args: { key: tool.schema.string(), value: tool.schema.string() },
  async execute(args) {
    db.query("insert or replace into kv values (?, ?)").run(args.key, args.value)
    return (db.query("select v from kv where k = ?").get(args.key) as { v: string }).v
  },
})

export default search
export { search }
export const VERSION = "1.4.0"
export const nothing = tool({
  description: "Returns nothing at all",
  args: {},
  async execute() { return undefined },
})
"""

WORKSPACE = {
    ".opencode/tool/waiter.ts": WAITER_TS,
    ".opencode/tool/spin.ts": SPIN_TS,
    ".opencode/tool/echo.ts": ECHO_TS,
    ".opencode/plugin/rewriter.ts": PLUGIN_TS,
    ".opencode/plugin/exploder.ts": BROKEN_PLUGIN_TS,
    ".opencode/tool/forecast.ts": FORECAST_TS,
    ".opencode/tool/lib/lines.ts": LINES_TS,
    ".opencode/tool/helpers.ts": HELPERS_TS,
    ".opencode/tool/count.ts": COUNT_TS,
    ".opencode/tool/db.ts": DB_TS,
}


session_id = workspace_session(WORKSPACE)


def read_output(path: str, text: str) -> str:
    """What `read` answers for a one-line file without a final newline."""
    return f"<path>{path}</path>\n<type>file</type>\n<content>1: {text}\n\n(End of file - total 1 lines)\n</content>"


async def read_when_present(client: AsyncClient, session_id: str, path: str) -> str:
    """`read`'s output once the file exists (a tool's side effect may land just after its call ended)."""
    deadline = time.monotonic() + 5
    while True:
        out = await client.execute_tool(session_id, "read", {"filePath": path})
        if out.error is None or time.monotonic() > deadline:
            assert out.error is None, out.error
            return out.output
        await asyncio.sleep(0.05)


async def start_call(client: AsyncClient, session_id: str, tool: str, args: dict[str, Any], call_id: str,
                     ready_title: str) -> tuple[asyncio.Queue[tool_pb2.ExecuteToolRequest | None],
                                                AsyncIterator[tool_pb2.ToolEvent]]:
    """Starts a raw call and returns once its tool sent the metadata titled `ready_title`."""
    stream, outbox = client.tool_call(session_id, tool, args, call_id=call_id)
    events = stream.__aiter__()
    async for event in events:
        if event.WhichOneof("event") == "metadata" and event.metadata.title == ready_title:
            return outbox, events
        assert event.WhichOneof("event") == "state", event
    raise AssertionError(f"{tool} ended before it was ready")


async def final_event(events: AsyncIterator[tool_pb2.ToolEvent]) -> tool_pb2.ToolEvent:
    async for event in events:
        if event.WhichOneof("event") in ("result", "error"):
            return event
    raise AssertionError("the call ended without a result or an error")


# -- abort ---------------------------------------------------------------------------------------


async def test_abort_message_fires_ctx_abort(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    marker = "/workspace/abort-message.txt"
    outbox, events = await start_call(client, session_id, "waiter", {"marker": marker}, "c-abort-1", "waiting")
    outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="user pressed stop")))
    final = await asyncio.wait_for(final_event(events), 10)
    outbox.put_nowait(None)
    assert (final.call_id, final.WhichOneof("event"), final.error.message) == ("c-abort-1", "error", ABORTED)
    assert await read_when_present(client, session_id, marker) == read_output(marker, "true aborted")


async def test_cancel_from_a_second_connection_fires_ctx_abort(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    marker = "/workspace/abort-cancel.txt"
    outbox, events = await start_call(client, session_id, "waiter", {"marker": marker}, "c-abort-2", "waiting")
    async with AsyncClient(docker_plane.plane.address, docker_plane.token) as other:
        assert await other.cancel_tool_call(session_id, "c-abort-2") is True
        final = await asyncio.wait_for(final_event(events), 10)
        assert await other.cancel_tool_call(session_id, "c-abort-2") is False  # already over
    outbox.put_nowait(None)
    assert (final.WhichOneof("event"), final.error.message) == ("error", ABORTED)
    assert await read_when_present(client, session_id, marker) == read_output(marker, "true aborted")


async def test_busy_loop_is_killed_on_abort_and_the_next_call_works(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    outbox, events = await start_call(client, session_id, "spin", {}, "c-spin", "spinning")
    await asyncio.sleep(0.2)  # well inside the loop by now
    aborted_at = time.monotonic()
    outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="stop")))
    final = await asyncio.wait_for(final_event(events), 10)
    outbox.put_nowait(None)
    assert (final.WhichOneof("event"), final.error.message) == ("error", ABORTED_WITH_RESTART)
    assert time.monotonic() - aborted_at < 3.0
    # No busy process of the call is left: nothing in the sandbox burns a CPU any more.
    ps = await client.run(session_id, ["ps", "-eo", "pcpu=,args="])
    assert ps.exit_code == 0
    assert not [line for line in ps.stdout.decode().splitlines() if float(line.split()[0]) > 50.0], ps.stdout
    started = time.monotonic()
    out = await client.execute_tool(session_id, "echo", {"text": "after the loop"})
    assert (out.error, out.output) == (None, "echo: after the loop")
    assert time.monotonic() - started < 5.0  # the host restarts and re-imports the files once
    # A second busy loop is stopped by CancelToolCall from another connection just the same.
    outbox, events = await start_call(client, session_id, "spin", {}, "c-spin-2", "spinning")
    async with AsyncClient(docker_plane.plane.address, docker_plane.token) as other:
        assert await other.cancel_tool_call(session_id, "c-spin-2") is True
    final = await asyncio.wait_for(final_event(events), 10)
    outbox.put_nowait(None)
    assert final.error.message == ABORTED_WITH_RESTART
    out = await client.execute_tool(session_id, "plug_echo", {"text": "still"})
    assert out.output == "plugin says still (dir=/workspace tree=/ agent=build)"


# -- project plugins -----------------------------------------------------------------------------


async def test_plugin_tool_is_listed_and_callable(docker_plane: Plane, session_id: str) -> None:
    listing = await docker_plane.client.list_tools(session_id)
    tools = custom_tools(listing)
    plugin = tools["plug_echo"]
    assert (plugin.source, plugin.origin, plugin.description) == (
        tool_pb2.ToolDefinition.PLUGIN, "/workspace/.opencode/plugin/rewriter.ts", "Echoes from a project plugin",
    )
    assert json.loads(plugin.parameters_json_schema)["properties"] == {"text": {"type": "string"}}
    assert list(tools)[-1] == "plug_echo"  # plugin tools come after every file tool
    out = await docker_plane.client.execute_tool(session_id, "plug_echo", {"text": "hi"})
    assert (out.error, out.output) == (None, "plugin says hi (dir=/workspace tree=/ agent=build)")


async def test_plugin_hooks_rewrite_args_and_title(docker_plane: Plane, session_id: str) -> None:
    out = await docker_plane.client.execute_tool(
        session_id, "bash", {"command": "echo original", "description": "Prints a word"},
    )
    assert out.error is None
    assert out.output == "rewritten\n"
    assert out.result is not None
    assert out.result.title == "after(bash): Prints a word"
    # Other commands pass through the before-hook untouched.
    out = await docker_plane.client.execute_tool(
        session_id, "bash", {"command": "echo other", "description": "Prints another"},
    )
    assert (out.output, out.result.title if out.result else None) == ("other\n", "after(bash): Prints another")


async def test_a_plugin_failing_at_load_is_reported_and_the_session_goes_on(
    docker_plane: Plane, session_id: str,
) -> None:
    listing = await docker_plane.client.list_tools(session_id)
    errors = [(e.origin, e.message) for e in listing.load_errors]
    assert errors == [("/workspace/.opencode/plugin/exploder.ts", "plugin Exploder: plugin exploded at load")]
    out = await docker_plane.client.execute_tool(session_id, "echo", {"text": "alive"})
    assert out.output == "echo: alive"


ENV_PLUGIN_TS = """export const Shaper = async () => ({
  "shell.env": async (input, output) => {
    output.env.FROM_PLUGIN = `cwd=${input.cwd} call=${input.callID} had=${Object.keys(output.env).length}`
  },
  "tool.definition": async (input, output) => {
    if (input.toolID === "glob") output.description = "Finds files (shaped by a project plugin)"
  },
})
"""


async def test_project_plugins_shell_env_and_tool_definition_hooks(docker_plane: Plane) -> None:
    client = docker_plane.client
    session = await client.create_session(workspace_archive=tar_of({".opencode/plugin/shaper.ts": ENV_PLUGIN_TS}))
    try:
        tools = {t.id: t for t in (await client.list_tools(session.id)).tools}
        assert tools["glob"].description == "Finds files (shaped by a project plugin)"
        assert tools["grep"].description != tools["glob"].description
        out = await client.execute_tool(session.id, "bash", {"command": "echo $FROM_PLUGIN", "description": "env"},
                                        call_id="call_env1")
        assert out.output == "cwd=/workspace call=call_env1 had=0\n"
        out = await client.execute_tool(session.id, "bash", {"command": "echo $FROM_PLUGIN", "workdir": "/tmp",
                                                             "description": "env"}, call_id="call_env2",
                                        on_permission=allow_once)
        assert out.output == "cwd=/tmp call=call_env2 had=0\n"
    finally:
        await client.delete_session(session.id)


# -- re-scan on ListTools ------------------------------------------------------------------------


def fresh_tool(description: str, answer: str) -> str:
    return (
        'import { tool } from "@opencode-ai/plugin"\n\n'
        f"export default tool({{ description: {json.dumps(description)}, args: {{}}, "
        f"async execute() {{ return {json.dumps(answer)} }} }})\n"
    )


async def test_tools_added_changed_and_removed_by_reload(docker_plane: Plane, session_id: str) -> None:
    """Tool files a call writes are data until the caller reloads (custom/snapshot.py): listings stay as the
    session's code snapshot says, and each ReloadTools takes the workspace's files of that moment."""
    client = docker_plane.client
    path = f"{TOOL_DIR}/fresh.ts"
    assert "fresh" not in custom_tools(await client.list_tools(session_id))

    written = await client.execute_tool(session_id, "write", {"filePath": path, "content": fresh_tool("v1", "one")})
    assert written.error is None, written.error
    assert "fresh" not in custom_tools(await client.list_tools(session_id))
    report = await client.reload_tools(session_id)
    assert (list(report.added_tools), list(report.added_files)) == (["fresh"], [path])
    fresh = custom_tools(await client.list_tools(session_id))["fresh"]
    assert (fresh.description, fresh.origin) == ("v1", path)
    assert (await client.execute_tool(session_id, "fresh", {})).output == "one"

    content = fresh_tool("version two", "the second answer")
    written = await client.execute_tool(session_id, "write", {"filePath": path, "content": content})
    assert written.error is None, written.error
    assert custom_tools(await client.list_tools(session_id))["fresh"].description == "v1"
    assert (await client.execute_tool(session_id, "fresh", {})).output == "one"
    report = await client.reload_tools(session_id)
    assert (list(report.changed_tools), list(report.changed_files)) == (["fresh"], [path])
    assert custom_tools(await client.list_tools(session_id))["fresh"].description == "version two"
    assert (await client.execute_tool(session_id, "fresh", {})).output == "the second answer"

    removed = await client.execute_tool(session_id, "bash", {"command": f"rm {path}", "description": "Removes it"})
    assert removed.error is None, removed.error
    assert (await client.execute_tool(session_id, "fresh", {})).output == "the second answer"
    report = await client.reload_tools(session_id)
    assert (list(report.removed_tools), list(report.removed_files)) == (["fresh"], [path])
    listing = await client.list_tools(session_id)
    assert "fresh" not in custom_tools(listing)
    out = await client.execute_tool(session_id, "fresh", {})
    # The model is told, through upstream's `invalid` tool, what it may call instead.
    assert out.result is not None
    assert out.result.title == "Invalid Tool"
    prefix = "The arguments provided to the tool are invalid: Model tried to call unavailable tool 'fresh'. "
    assert out.output.startswith(prefix + "Available tools: "), out.output
    available = out.output.removeprefix(prefix + "Available tools: ").removesuffix(".").split(", ")
    assert "fresh" not in available
    assert {"bash", "echo", "plug_echo", "db_search"} <= set(available)
    # The neighbours work in the restarted hosts.
    assert (await client.execute_tool(session_id, "echo", {"text": "x"})).output == "echo: x"


# -- real-world tool files -----------------------------------------------------------------------


async def test_real_world_tool_files_are_listed(docker_plane: Plane, session_id: str) -> None:
    tools = custom_tools(await docker_plane.client.list_tools(session_id))
    assert list(tools) == [
        "count", "db", "db_nothing", "db_search", "echo", "forecast", "spin", "waiter", "plug_echo",
    ]
    assert json.loads(tools["forecast"].parameters_json_schema) == {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"}, "days": {"default": 3, "type": "number"},
        },
        "required": ["city", "days"], "additionalProperties": False,
    }
    assert json.loads(tools["count"].parameters_json_schema)["properties"] == {
        "parts": {"type": "array", "items": {"type": "string"}},
    }
    assert tools["db"].description == tools["db_search"].description == "Stores a value and reads it back from SQLite"


async def test_real_world_tool_files_are_callable(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client

    async def call(tool: str, args: dict[str, Any]) -> ToolOutcome:
        out = await client.execute_tool(session_id, tool, args)
        assert out.error is None, f"{tool}: {out.error}"
        return out

    assert (await call("forecast", {"city": "Oslo"})).output == '{"city":"Oslo","days":3}'
    counted = await call("count", {"parts": ["a", "b", "c"]})
    assert counted.output == "3"
    live = [json.loads(e.metadata.metadata_json) for e in counted.events if e.WhichOneof("event") == "metadata"]
    assert live == [{"cwd": "/workspace"}]
    assert (await call("db", {"key": "k", "value": "stored"})).output == "stored"
    assert (await call("db_search", {"key": "k2", "value": "again"})).output == "again"
    nothing = await call("db_nothing", {})
    assert nothing.output == ""
    assert nothing.result is not None
    assert nothing.result.title == ""
