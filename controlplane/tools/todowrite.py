"""`todowrite`: replaces the session's todo list (kept in the control plane's store, per session)."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field

from controlplane.core.calls import arg_worker
from controlplane.core.calls.tool import (
    InitContext,
    PermissionAsk,
    ToolContext,
    ToolDefinition,
    ToolError,
    ToolInfo,
    ToolResult,
)
from controlplane.core.sessions.services import TodoStore
from controlplane.tools.describe import description
from opencode_semantics.javascript import json_stringify


class TodoItem(BaseModel):
    content: str = Field(description="Brief description of the task")
    status: str = Field(description="Current status of the task: pending, in_progress, completed, cancelled")
    priority: str = Field(description="Priority level of the task: high, medium, low")


class TodoWriteParams(BaseModel):
    todos: list[TodoItem] = Field(description="The updated todo list")


LARGE_LIST = 256
"""From this many items the result is made in a worker thread, off the loop every tenant shares."""


def todo_store(ctx: ToolContext) -> TodoStore:
    if ctx.services.todos is None:
        raise ToolError("This session has no todo storage.")
    return ctx.services.todos


def todo_result(todos: list[dict[str, Any]], output: str | None = None) -> ToolResult:
    """Upstream's shape: `JSON.stringify(todos, null, 2)` (`output` when already made), titled by the todos
    not completed."""
    left = sum(1 for t in todos if t.get("status") != "completed")
    text = json_stringify(todos, indent=2) if output is None else output
    return ToolResult(title=f"{left} todos", output=text, metadata={"todos": todos})


def _as_sent(todos: list[dict[str, Any]], raw: Any) -> list[dict[str, Any]]:
    """Each item's keys in the order the caller sent them (upstream stringifies the raw arguments);
    keys a hook added stay after them."""
    sent = raw.get("todos") if isinstance(raw, dict) else None
    if not isinstance(sent, list):
        return todos
    ordered = []
    for i, item in enumerate(todos):
        original = sent[i] if i < len(sent) and isinstance(sent[i], dict) else {}
        first = [k for k in original if k in item]
        # Already in the sent order (the usual case): the item itself, not a copy of a list of many MiB.
        in_order = all(a == b for a, b in zip(item, first, strict=False))
        ordered.append(item if in_order else {**{k: item[k] for k in first}, **item})
    return ordered


async def _execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    await ctx.ask(PermissionAsk("todowrite", ["*"], ["*"], {}))
    large = len(args["todos"]) > LARGE_LIST
    # A large list's key reordering takes the loop about a second per 100,000 items: a thread's work.
    todos = await asyncio.to_thread(_as_sent, args["todos"], ctx.services.raw_args) if large else _as_sent(
        args["todos"], ctx.services.raw_args)
    await todo_store(ctx).put_todos(ctx.session_id, todos)
    ctx.services.publish("todo.updated", sessionID=ctx.session_id, todos=todos)
    if large:  # upstream's JSON.stringify with an indent, in Python: 0.8 s of CPU for an 8 MiB list
        output = await arg_worker.stringified(todos, indent=2)
        return todo_result(todos, output) if output is not None else await asyncio.to_thread(todo_result, todos)
    return todo_result(todos)


async def _init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(description("todowrite"), TodoWriteParams, _execute)


TOOL = ToolInfo(id="todowrite", init=_init)
