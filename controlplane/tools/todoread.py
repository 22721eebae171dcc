"""`todoread`: the session's todo list (defined upstream but not registered: callable, not listed)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from controlplane.core.calls.tool import InitContext, PermissionAsk, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.tools.describe import description
from controlplane.tools.todowrite import todo_result, todo_store


class TodoReadParams(BaseModel):
    pass


async def _execute(_: dict[str, Any], ctx: ToolContext) -> ToolResult:
    await ctx.ask(PermissionAsk("todoread", ["*"], ["*"], {}))
    return todo_result(await todo_store(ctx).get_todos(ctx.session_id))


async def _init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(description("todoread"), TodoReadParams, _execute)


TOOL = ToolInfo(id="todoread", init=_init)
