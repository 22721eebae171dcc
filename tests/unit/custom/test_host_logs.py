"""What custom tools and plugins print reaches their authors, bounded: real Bun with the real
`@opencode-ai/plugin`, and the Python host (print, sys.stderr, logging), through the agent's host driver."""

from __future__ import annotations

import asyncio

from sandbox_agent import tool_logs
from sandbox_agent.custom.host import HostFile, ToolHost
from tests.unit.custom.conftest import Sandbox

CHATTY_TS = """
    import { tool } from "@opencode-ai/plugin"
    console.log("loading chatty", { version: 2 })
    export default tool({
      description: "Prints while it works",
      args: { n: tool.schema.number() },
      async execute(args) {
        console.info("working on", args.n)
        await new Promise((resolve) => setTimeout(resolve, 5))
        console.warn("almost done")
        console.error(new Error("not really").message)
        return "done"
      },
    })
"""
PLUGIN_TS = """
    export const Quiet = async () => {
      console.warn("quiet plugin: disabled, no API key")
      return {}
    }
"""
FLOOD_TS = """
    import { tool } from "@opencode-ai/plugin"
    export default tool({
      description: "Prints in a loop",
      args: {},
      async execute() {
        for (let i = 0; i < 20000; i++) console.log("line " + i + " " + "x".repeat(100))
        console.log("y".repeat(100000))
        return "flooded"
      },
    })
"""
CHATTY_PY = """
import logging
import sys
from opencode_tool import tool

print("loading chatty.py")


@tool(description="Prints while it works", args={"type": "object", "properties": {}})
def default(args, ctx):
    print("working")
    print("partial", end="")
    sys.stderr.write("to stderr\\n")
    logging.warning("a warning")
    logging.info("below the root logger's level")
    return "done"
"""
NONL_PY = """
import time
from opencode_tool import tool


@tool(description="Writes 50 MiB with no newline", args={"type": "object", "properties": {}})
async def default(args, ctx):
    started = time.monotonic()
    print("x" * (50 * 1024 * 1024), end="")
    return f"{time.monotonic() - started:.3f}"
"""


async def _call(
    sandbox: Sandbox, host: ToolHost, tool: str, args: dict[str, object],
) -> tuple[str, list[tool_logs.LogLine]]:
    lines: list[tool_logs.LogLine] = []
    result = await host.call(tool, args, sandbox.context(), on_metadata=sandbox.recorder.on_metadata,
                             on_ask=sandbox.recorder.on_ask, abort=asyncio.Event(), timeout_s=20.0,
                             on_log=lines.append)
    return result.output, lines


async def test_bun_load_time_output_comes_with_the_listing(sandbox: Sandbox, bun_host: ToolHost) -> None:
    tool = sandbox.tool("chatty.ts", CHATTY_TS)
    plugin = str(sandbox.plugins / "quiet.ts")
    (sandbox.plugins / "quiet.ts").write_text(PLUGIN_TS)
    loaded = await bun_host.load([HostFile(tool, "tool"), HostFile(plugin, "plugin")], str(sandbox.project),
                                 str(sandbox.project))
    assert [(line.origin, line.level, line.text) for line in loaded.logs] == [
        (tool, "info", "loading chatty { version: 2 }"),
        (plugin, "warn", "quiet plugin: disabled, no API key"),
    ]
    # A reload that keeps the unchanged files lists what they printed again.
    again = await bun_host.load([HostFile(tool, "tool"), HostFile(plugin, "plugin")], str(sandbox.project),
                                str(sandbox.project))
    assert again.logs == loaded.logs


async def test_bun_call_output_comes_before_the_result(sandbox: Sandbox, bun_host: ToolHost) -> None:
    tool = sandbox.tool("chatty.ts", CHATTY_TS)
    await bun_host.load([HostFile(tool, "tool")], str(sandbox.project), str(sandbox.project))
    output, lines = await _call(sandbox, bun_host, "chatty", {"n": 3})
    assert output == "done"
    assert [(line.origin, line.level, line.text) for line in lines] == [
        (tool, "info", "working on 3"), (tool, "warn", "almost done"), (tool, "error", "not really"),
    ]


async def test_a_flooding_tool_is_cut_and_says_so(sandbox: Sandbox, bun_host: ToolHost) -> None:
    tool = sandbox.tool("flood.ts", FLOOD_TS)
    await bun_host.load([HostFile(tool, "tool")], str(sandbox.project), str(sandbox.project))
    output, lines = await _call(sandbox, bun_host, "flood", {})
    assert output == "flooded"
    # The host's own budget (64 Ki characters of text a call); the agent's CallLogs bounds again.
    assert sum(len(line.text) for line in lines) <= 64 * 1024 + 100
    assert lines[-1].level == "warn"
    assert lines[-1].text.endswith("more log lines dropped]")
    assert all(len(line.text.encode()) <= tool_logs.MAX_LINE_BYTES + 64 for line in lines)


async def test_python_print_stderr_and_logging(sandbox: Sandbox, py_host: ToolHost) -> None:
    tool = sandbox.tool("chatty.py", CHATTY_PY)
    loaded = await py_host.load([HostFile(tool, "tool")], str(sandbox.project), str(sandbox.project))
    assert [(line.origin, line.text) for line in loaded.logs] == [(tool, "loading chatty.py")]
    output, lines = await _call(sandbox, py_host, "chatty", {})
    assert output == "done"
    assert [(line.level, line.text) for line in lines] == [
        ("info", "working"), ("error", "to stderr"), ("warn", "a warning"), ("info", "partial"),
    ]


async def test_python_line_with_no_newline_is_cut_as_it_grows(sandbox: Sandbox, py_host: ToolHost) -> None:
    tool = sandbox.tool("nonl.py", NONL_PY)
    await py_host.load([HostFile(tool, "tool")], str(sandbox.project), str(sandbox.project))
    output, lines = await _call(sandbox, py_host, "nonl", {})
    # The write itself is linear: well under the seconds a quadratic cut of 50 MiB takes.
    assert float(output) < 5.0
    assert [len(line.text) for line in lines[:-1]] == [8192] * 8  # the call's 64 Ki characters, in pieces
    assert lines[-1].text == f"[{50 * 1024 * 1024 // 8192 - 8} more log lines dropped]"


def test_the_agent_bounds_what_a_host_sends_whatever_it_claims() -> None:
    line = tool_logs.line_from({"origin": "t.ts", "level": "shout", "text": "x" * 100_000, "at": "soon"})
    assert line.level == "info"
    assert line.text.endswith("bytes cut]")
    assert len(line.text.encode()) < tool_logs.MAX_LINE_BYTES + 64
    budget = tool_logs.CallLogs(limit=1000)
    sent = [budget.admit(tool_logs.LogLine("t.ts", "info", "y" * 84, 0.0)) for _ in range(50)]
    assert sent.count(True) == 10
    dropped = budget.close()
    assert dropped is not None
    assert dropped.text == "[40 more log lines dropped]"
    assert tool_logs.CallLogs().close() is None
    many = tool_logs.load_lines([{"text": str(i)} for i in range(tool_logs.LOAD_LOG_LINES + 7)])
    assert len(many) == tool_logs.LOAD_LOG_LINES + 1
    assert many[-1].text == "[7 more log lines dropped]"
