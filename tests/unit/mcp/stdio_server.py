"""A stdio MCP server for the tests, on the official SDK's low-level server API.

Usage: python stdio_server.py [ok|crash|hang|nolist|paged|noisy] (noisy: a non-JSON line on stdout
first). `MARKER` (env) names a file where a
cancelled `slow` call writes "cancelled"; `PIDFILE` (env) one where the server writes its pid.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

if os.environ.get("PIDFILE"):  # before the slow imports, so even a server killed while starting has one
    with open(os.environ["PIDFILE"], "w") as pidfile:
        pidfile.write(str(os.getpid()))

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"


def _tool(name: str, schema: dict[str, Any], description: str | None = None) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema=schema)


TOOLS = [
    _tool("echo", {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}, "Echoes text"),
    _tool("mixed", {"type": "object", "properties": {}}, "Every kind of content"),
    _tool("fails", {"type": "object", "properties": {}}, "Returns isError"),
    _tool("env", {"type": "object"}, None),
    _tool("slow", {"type": "object", "properties": {"seconds": {"type": "number"}}}, "Sleeps"),
    _tool("progress", {"type": "object", "properties": {"steps": {"type": "integer"}, "gap": {"type": "number"}}}),
    _tool("die", {"type": "object", "properties": {}}, "Exits the server"),
    _tool("weird.name tool", {"type": "object", "properties": {}}, "A name to sanitize"),
    _tool(
        "nested",
        {
            "type": "object",
            "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}},
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
            "required": ["items"],
            "additionalProperties": True,
        },
        "Has $defs",
    ),
]


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    if MODE == "nolist":
        raise RuntimeError("listing is broken")
    if MODE == "paged":
        if params is None or params.cursor is None:
            return types.ListToolsResult(tools=TOOLS[:2], next_cursor="page2")
        return types.ListToolsResult(tools=TOOLS[2:])
    return types.ListToolsResult(tools=TOOLS)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    name = params.name
    if name == "echo":
        return types.CallToolResult(content=[_text(str(args.get("text")))])
    if name == "mixed":
        return types.CallToolResult(content=[
            _text("first"),
            types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
            _text(""),
            _text("second"),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="file:///notes.txt", text="resource text", mime_type="text/plain")),
            types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
                uri="file:///data.bin", blob="AAEC")),
            types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
                uri="file:///pic.gif", blob="R0lGODlh", mime_type="image/gif")),
            types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="file:///empty.txt", text="")),
            types.AudioContent(type="audio", data="UklGRg==", mime_type="audio/wav"),
            types.ResourceLink(type="resource_link", uri="file:///linked.txt", name="linked"),
        ])
    if name == "fails":
        return types.CallToolResult(content=[_text("it broke")], is_error=True)
    if name == "env":
        return types.CallToolResult(content=[_text(f"{os.environ.get('GREETING')}|{os.getcwd()}")])
    if name == "slow":
        try:
            await anyio.sleep(float(args.get("seconds", 30)))
        except BaseException:
            marker = os.environ.get("MARKER")
            if marker:
                # Synchronous on purpose: inside a cancelled scope every await is cancelled again.
                Path(marker).write_text("cancelled")  # noqa: ASYNC240
            raise
        return types.CallToolResult(content=[_text("slept")])
    if name == "progress":
        steps, gap = int(args.get("steps", 3)), float(args.get("gap", 0.1))
        for step in range(steps):
            await anyio.sleep(gap)
            await ctx.session.report_progress(step + 1, steps, f"step {step + 1}")
        return types.CallToolResult(content=[_text(f"done after {steps} steps")])
    if name == "die":
        os._exit(7)
    return types.CallToolResult(content=[_text(f"called {name}")])


async def main() -> None:
    server = Server("test-server", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    if MODE == "crash":
        print("boom: cannot start", file=sys.stderr, flush=True)
        sys.exit(3)
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "noisy":
        print("starting up, not JSON", flush=True)
    anyio.run(main)
