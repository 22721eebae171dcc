"""`batch`: up to 25 calls of registry tools run concurrently, each as a call of its own.

Each entry runs through the executor like any call (validation, hooks, permissions, truncation)
under its own call id; its events go to the batch's stream. The batch's own output is only a
summary, as upstream's: the entries' outputs are in their own results.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolError, ToolInfo, ToolResult
from controlplane.core.sessions.services import SubCalls, SubOutcome
from controlplane.tools.describe import description

MAX_CALLS = 25
DISALLOWED = ("batch",)
NOT_SUGGESTED = frozenset({"invalid", "patch", "apply_patch", *DISALLOWED})
TOO_MANY = f"Maximum of {MAX_CALLS} tools allowed in batch"
ABORTED = "Tool execution aborted"
PAYLOAD_FORMAT = 'Expected payload format:\n  [{"tool": "tool_name", "parameters": {...}}, {...}]'
AT_LEAST_ONE = "Provide at least one tool call"
KEEP_BATCHING = "Keep using the batch tool for optimal performance in your next response!"


class ToolParameters(BaseModel):
    model_config = ConfigDict(extra="allow")


class BatchCall(BaseModel):
    tool: str = Field(description="The name of the tool to execute")
    parameters: ToolParameters = Field(description="Parameters for the tool")


class BatchParams(BaseModel):
    tool_calls: list[BatchCall] = Field(min_length=1, description="Array of tool calls to execute in parallel")


def format_validation_error(error: ValidationError) -> str:
    lines = []
    for issue in error.errors():
        path = ".".join(str(p) for p in issue["loc"]) or "root"
        message = issue["msg"]
        if issue["type"] == "too_small" and tuple(issue["loc"]) == ("tool_calls",):
            message = AT_LEAST_ONE  # the schema's own message for `.min(1)`
        lines.append(f"  - {path}: {message}")
    return "Invalid parameters for tool 'batch':\n" + "\n".join(lines) + "\n\n" + PAYLOAD_FORMAT


def disallowed_message(tool: str) -> str:
    return f"Tool '{tool}' is not allowed in batch. Disallowed tools: {', '.join(DISALLOWED)}"


def not_in_registry_message(tool: str, registered: list[str]) -> str:
    available = ", ".join(t for t in registered if t not in NOT_SUGGESTED)
    return (
        f"Tool '{tool}' not in registry. External tools (MCP, environment) cannot be batched - call them directly."
        f" Available tools: {available}"
    )


async def _one(calls: SubCalls, registered: list[str], entry: dict[str, Any]) -> SubOutcome:
    tool = entry["tool"]
    if tool in DISALLOWED:
        return calls.refuse(tool, disallowed_message(tool))
    if tool not in registered:
        return calls.refuse(tool, not_in_registry_message(tool, registered))
    return await calls.run(tool, entry["parameters"])


def summary(outcomes: list[SubOutcome], tools: list[str]) -> ToolResult:
    ok = sum(1 for o in outcomes if o.ok)
    total, failed = len(outcomes), len(outcomes) - ok
    if failed:
        output = f"Executed {ok}/{total} tools successfully. {failed} failed."
    else:
        output = f"All {ok} tools executed successfully.\n\n{KEEP_BATCHING}"
    return ToolResult(
        title=f"Batch execution ({ok}/{total} successful)",
        output=output,
        metadata={
            "totalCalls": total, "successful": ok, "failed": failed, "tools": tools,
            "details": [{"tool": o.tool, "success": o.ok} for o in outcomes],
        },
        attachments=[a for o in outcomes if o.result is not None for a in o.result.attachments],
    )


async def _execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    calls = ctx.services.subcalls
    if calls is None:
        raise ToolError("Batched calls cannot run in this context.")
    entries: list[dict[str, Any]] = args["tool_calls"]
    registered = calls.registered()
    outcomes = list(await asyncio.gather(*(_one(calls, registered, e) for e in entries[:MAX_CALLS])))
    outcomes += [calls.refuse(e["tool"], TOO_MANY) for e in entries[MAX_CALLS:]]
    if ctx.abort.is_set():
        raise ToolError(ABORTED)
    return summary(outcomes, [e["tool"] for e in entries])


async def _init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(description("batch"), BatchParams, _execute, format_validation_error)


TOOL = ToolInfo(id="batch", init=_init)
