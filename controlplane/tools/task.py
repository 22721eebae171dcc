"""`task`: delegates work to a subagent in a child session that the client's own loop drives.

See controlplane.core.calls.subtasks for the child sessions and the wait for the client's answer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from controlplane.core.calls.subtasks import CallerScope, SessionBoundTool
from controlplane.core.calls.tool import (
    InitContext,
    PermissionAsk,
    ToolContext,
    ToolDefinition,
    ToolError,
    ToolInfo,
    ToolResult,
)
from controlplane.core.calls.tool_events import SubtaskRequested
from controlplane.core.permissions import permission, rule_layers
from controlplane.core.permissions.permission import Agent
from controlplane.tools.describe import description

NO_DESCRIPTION = "This subagent should only be called manually by the user."


class TaskParams(BaseModel):
    description: str = Field(description="A short (3-5 words) description of the task")
    prompt: str = Field(description="The task for the agent to perform")
    subagent_type: str = Field(description="The type of specialized agent to use for this task")
    task_id: str | None = Field(
        None,
        description=(
            "This should only be set if you mean to resume a previous task (you can pass a prior task_id and the "
            "task will continue the same subagent session as before instead of creating a fresh one)"
        ),
    )
    command: str | None = Field(None, description="The command that triggered this task")


def describe_agents(agents: Mapping[str, Agent], caller: Agent) -> str:
    """The tool description listing the non-primary agents `caller` is not denied to start."""
    listed = [
        f"- {agent.name}: {agent.description or NO_DESCRIPTION}"
        for agent in agents.values()
        if agent.mode != "primary" and rule_layers.decide("task", agent.name, caller).action != "deny"
    ]
    return description("task", agents="\n".join(listed))


def output(session_id: str, text: str) -> str:
    return "\n".join([
        f"task_id: {session_id} (for resuming to continue this task if needed)", "", "<task_result>", text,
        "</task_result>",
    ])


def agent_model(config_json: str, agent: str, ctx: ToolContext) -> dict[str, Any] | None:
    """The agent's configured `provider/model`, else the model the client said the caller uses."""
    config = json.loads(config_json) if config_json else {}
    agents = config.get("agent") if isinstance(config, dict) else None
    section = agents.get(agent) if isinstance(agents, dict) else None
    model = section.get("model") if isinstance(section, dict) else None
    if isinstance(model, str) and "/" in model:
        provider, _, model_id = model.partition("/")
        return {"modelID": model_id, "providerID": provider}
    given = ctx.extra.get("model")
    return dict(given) if isinstance(given, Mapping) else None


def bind(scope: CallerScope) -> ToolInfo:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        name, title = args["subagent_type"], args["description"]
        if not ctx.extra.get("bypassAgentCheck"):
            await ctx.ask(PermissionAsk("task", [name], ["*"], {"description": title, "subagent_type": name}))
        agent = scope.agents.get(name)
        if agent is None:
            raise ToolError(f"Unknown agent type: {name} is not a valid agent type")
        child, resumed = await scope.subtasks.open_child(scope, agent.name, title, args.get("task_id") or "")
        model = agent_model(scope.session.config_json, agent.name, ctx)
        metadata = {"sessionId": child.id, "model": model}
        await ctx.metadata(title, metadata)
        request = SubtaskRequested(
            session_id=child.id, parent_session_id=scope.session.id, agent=agent.name, prompt=args["prompt"],
            description=title, model=model, command=args.get("command") or "", resumed=resumed,
        )
        text = await scope.subtasks.run(
            scope.tenant, ctx.session_id, ctx.call_id, request, ctx.abort, ctx.services.announce,
        )
        return ToolResult(title=title, output=output(child.id, text), metadata=metadata)

    async def init(_: InitContext) -> ToolDefinition:
        return ToolDefinition(describe_agents(scope.agents, scope.caller), TaskParams, execute)

    return ToolInfo(id="task", init=init)


async def _unbound_execute(_: dict[str, Any], __: ToolContext) -> ToolResult:
    raise ToolError("The task tool needs a session to run in")


@functools.cache
def _default_description() -> str:
    agents = permission.builtin_agents("/tool-output", [], "/plans", [], home="/")
    return describe_agents(agents, agents["build"])


async def _unbound_init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(_default_description(), TaskParams, _unbound_execute)


TOOL = SessionBoundTool(id="task", init=_unbound_init, bind=bind)
"""Bound to the calling session by the tool runtime; unbound, it lists the built-in subagents."""
