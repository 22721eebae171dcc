"""`plan_exit`: asks the user (Yes/No) whether to leave the plan agent for the build agent.

Upstream then inserts a synthetic user message for the `build` agent. The conversation belongs to
the client here, so the result's metadata tells it what to do: `switch_agent` ("build") and
`message` (the synthetic message's text).
"""

from __future__ import annotations

import posixpath
from typing import Any

from pydantic import BaseModel

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolError, ToolInfo, ToolResult
from controlplane.core.permissions.questions import QuestionRejectedError
from controlplane.tools.describe import description
from controlplane.tools.question import ask

WORKTREE = "/"
"""Sandbox workspaces are not treated as git worktrees, so upstream names the plan relative to `/`."""
APPROVED = "User approved switching to build agent. Wait for further instructions."


class PlanExitParams(BaseModel):
    pass


def switch_question(plan: str) -> dict[str, Any]:
    return {
        "question": f"Plan at {plan} is complete. Would you like to switch to the build agent and start implementing?",
        "header": "Build Agent",
        "custom": False,
        "options": [
            {"label": "Yes", "description": "Switch to build agent and start implementing the plan"},
            {"label": "No", "description": "Stay with plan agent to continue refining the plan"},
        ],
    }


async def _execute(_: dict[str, Any], ctx: ToolContext) -> ToolResult:
    if not ctx.services.plan_path:
        raise ToolError("This session has no plan file.")
    plan = posixpath.relpath(ctx.services.plan_path, WORKTREE)
    answers = await ask(ctx, [switch_question(plan)])
    if answers and answers[0] and answers[0][0] == "No":
        raise QuestionRejectedError()
    message = f"The plan at {plan} has been approved, you can now edit files. Execute the plan"
    return ToolResult(
        title="Switching to build agent", output=APPROVED, metadata={"switch_agent": "build", "message": message},
    )


async def _init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(description("plan_exit"), PlanExitParams, _execute)


TOOL = ToolInfo(id="plan_exit", init=_init)
