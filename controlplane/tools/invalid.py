"""`invalid`: what a call to an unknown tool or with unparseable arguments is rerouted to.

It runs in the control plane (nothing touches the sandbox) and only echoes the error back.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.tools.describe import description


class InvalidParams(BaseModel):
    tool: str
    error: str


async def _execute(args: dict[str, Any], _: ToolContext) -> ToolResult:
    return ToolResult(
        title="Invalid Tool",
        output=f"The arguments provided to the tool are invalid: {args['error']}",
        metadata={},
    )


async def _init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(description("invalid"), InvalidParams, _execute)


TOOL = ToolInfo(id="invalid", init=_init)
