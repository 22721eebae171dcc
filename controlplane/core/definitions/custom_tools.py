"""Custom and plugin tools: defined by project files, loaded and run by the sandbox's tool hosts.

Their arguments are validated by their own runtime (zod in Bun, pydantic in Python), so the
control plane shows the schema the host reported and passes the arguments through.
"""

from __future__ import annotations

from typing import Any

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolInfo, ToolResult, ToolSource
from controlplane.core.seam.messages import CustomToolSpec


def custom_tool(spec: CustomToolSpec) -> ToolInfo:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await ctx.sandbox.run_custom(spec.id, args, ctx)

    definition = ToolDefinition(spec.description, None, execute, json_schema=dict(spec.parameters))

    async def init(_: InitContext) -> ToolDefinition:
        return definition

    source = ToolSource.PLUGIN if spec.source == "PLUGIN" else ToolSource.CUSTOM
    return ToolInfo(id=spec.id, init=init, source=source, origin=spec.origin, init_ms=spec.init_ms)
