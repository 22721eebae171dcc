"""MCP tools as registry entries, wrapped the way upstream wraps them.

Id `sanitize(server)_sanitize(tool)`; the input schema forced to an object that allows no extra
keys; execute asks permission `{id}` with patterns and always `["*"]`, calls the server, and maps
the content: text parts joined with a blank line, images as data-URL attachments, embedded
resources as their text or a blob attachment (other content kinds are dropped, as upstream does).

A result with `isError: true` is returned as ordinary output, not as a tool error: v1.2.27 never
looks at the flag (the model reads the server's error text as the tool's output).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types

from controlplane.core.calls.tool import (
    Attachment,
    InitContext,
    PermissionAsk,
    ToolContext,
    ToolDefinition,
    ToolInfo,
    ToolResult,
    ToolSource,
)
from controlplane.mcp.servers import McpServers

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
OCTET_STREAM = "application/octet-stream"


def sanitize(name: str) -> str:
    """Upstream's JS regex works on UTF-16 code units, so a character outside the BMP becomes two `_`."""
    return _UNSAFE.sub(lambda m: "__" if ord(m.group()) > 0xFFFF else "_", name)


def tool_id(server: str, tool: str) -> str:
    return f"{sanitize(server)}_{sanitize(tool)}"


def forced_schema(input_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The server's schema with `type`, `properties` and `additionalProperties` forced (other keys kept)."""
    given = dict(input_schema or {})
    properties = given.get("properties")
    return {**given, "type": "object", "properties": {} if properties is None else properties,
            "additionalProperties": False}


def to_tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    texts: list[str] = []
    attachments: list[Attachment] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            texts.append(item.text)
        elif isinstance(item, mcp_types.ImageContent):
            attachments.append(Attachment(mime=item.mime_type, url=f"data:{item.mime_type};base64,{item.data}"))
        elif isinstance(item, mcp_types.EmbeddedResource):
            resource = item.resource
            if isinstance(resource, mcp_types.TextResourceContents) and resource.text:
                texts.append(resource.text)
            elif isinstance(resource, mcp_types.BlobResourceContents) and resource.blob:
                mime = resource.mime_type or OCTET_STREAM
                attachments.append(Attachment(mime=mime, url=f"data:{mime};base64,{resource.blob}",
                                              filename=str(resource.uri)))
    return ToolResult(title="", output="\n\n".join(texts), metadata={}, attachments=attachments)


def mcp_tool_infos(servers: McpServers) -> list[ToolInfo]:
    """The tools of the connected servers, in registry order; a later duplicate id replaces an earlier one."""
    infos: dict[str, ToolInfo] = {}
    for server, tool in servers.tools():
        key = tool_id(server, tool.name)
        infos[key] = ToolInfo(id=key, init=_initializer(servers, server, tool, key), source=ToolSource.MCP,
                              origin=server)
    return list(infos.values())


def _initializer(
    servers: McpServers, server: str, tool: mcp_types.Tool, key: str
) -> Callable[[InitContext], Awaitable[ToolDefinition]]:
    schema = forced_schema(tool.input_schema)

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await ctx.ask(PermissionAsk(permission=key, patterns=["*"], always=["*"], metadata={}))
        result = await servers.call(server, tool.name, args, ctx.abort)
        return to_tool_result(result)

    definition = ToolDefinition(description=tool.description or "", parameters=None, execute=execute,
                                json_schema=schema)

    async def init(_: InitContext) -> ToolDefinition:
        return definition

    return init
