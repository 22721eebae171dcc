"""Built-in tools whose execution happens in the session's sandbox agent."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.tools.describe import description


def sandboxed_tool(tool_id: str, parameters: type[BaseModel], **placeholders: object) -> ToolInfo:
    """A tool described by `{tool_id}.txt` and run by the agent's module of the same id."""

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await ctx.sandbox.run_builtin(tool_id, args, ctx)

    async def init(_: InitContext) -> ToolDefinition:
        return ToolDefinition(description(tool_id, **placeholders), parameters, execute)

    return ToolInfo(id=tool_id, init=init)
