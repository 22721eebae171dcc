"""`skill`: loads a SKILL.md's instructions (the files are read in the sandbox, where the skills live)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, Field, create_model

from controlplane.core.calls.subtasks import CallerScope, SessionBoundTool
from controlplane.core.calls.tool import Execute, InitContext, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.core.permissions import rule_layers
from controlplane.tools.describe import description

NO_SKILLS = "No skills are currently available."
NAME_DESCRIPTION = "The name of the skill from available_skills"


class SkillParams(BaseModel):
    name: str = Field(description=NAME_DESCRIPTION)


def describe_skills(skills: Sequence[tuple[str, str]]) -> str:
    """The tool description for these (name, description) pairs: the skills the agent may load, in order."""
    if not skills:
        listing = NO_SKILLS
    else:
        listing = "\n".join(["## Available Skills", *(f"- **{name}**: {text}" for name, text in skills)])
    return description("skill", skills=listing)


def skill_parameters(names: Sequence[str]) -> type[BaseModel]:
    """The parameters, whose `name` description gives up to three of the listed skills as examples."""
    return _parameters_for(tuple(names[:3]))


@functools.lru_cache(maxsize=256)
def _parameters_for(examples_of: tuple[str, ...]) -> type[BaseModel]:
    # A pydantic model per distinct example list, made once: the runtime initialises the tool per call.
    if not examples_of:
        return SkillParams
    examples = ", ".join(f"'{name}'" for name in examples_of)
    return create_model(
        "SkillParams", __base__=BaseModel,
        name=(str, Field(description=f"{NAME_DESCRIPTION} (e.g., {examples}, ...)")),
    )


def _execute_in_sandbox(config: dict[str, Any]) -> Execute:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        # The agent discovers the skills again for the call, with the session's `skills.paths`.
        return await ctx.sandbox.run_builtin("skill", args, replace(ctx, extra={**ctx.extra, "config": config}))

    return execute


def _bind(scope: CallerScope) -> ToolInfo:
    """The skill tool of one session and calling agent: its skills, less those the agent is denied.

    Binding happens for every tool of every call, so the work waits for `init` (this tool's own use).
    """

    async def init(_: InitContext) -> ToolDefinition:
        allowed = [
            (name, text) for name, text in scope.skills
            if rule_layers.decide("skill", name, scope.caller).action != "deny"
        ]
        execute = _execute_in_sandbox(_config(scope.session.config_json))
        return ToolDefinition(describe_skills(allowed), skill_parameters([name for name, _ in allowed]), execute)

    return ToolInfo(id="skill", init=init)


def _config(config_json: str) -> dict[str, Any]:
    try:
        value = json.loads(config_json) if config_json else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


async def _unbound_init(_: InitContext) -> ToolDefinition:
    return ToolDefinition(describe_skills([]), SkillParams, _execute_in_sandbox({}))


TOOL = SessionBoundTool(id="skill", init=_unbound_init, bind=_bind)
"""Bound per session by the runtime: the description lists the skills its sandbox's last listing found."""
