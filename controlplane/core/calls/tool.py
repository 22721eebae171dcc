"""The tool model: an id plus `init(ctx)` giving description, parameters and execute.

Parameters are pydantic models; `parameters_schema()` turns one into the JSON Schema a model is
shown (the shape zod's `toJSONSchema` gives upstream). Execute receives the *validated* arguments
as a plain dict (defaults and coercions applied, undeclared keys kept: an intentional divergence
from v1.2.27, which validated and then passed the raw arguments).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ValidationError

from controlplane.core.calls.spooled import Spooled
from controlplane.core.calls.tool_log import ToolLogged
from controlplane.core.definitions.schema import parameters_schema
from controlplane.core.sessions.services import SessionServices
from controlplane.errors import ControlPlaneError

if TYPE_CHECKING:  # asks.py builds on this module: only its type is needed here
    from controlplane.core.permissions.asks import LocalRules


class ToolSource(enum.Enum):
    BUILTIN = "BUILTIN"
    CUSTOM = "CUSTOM"
    PLUGIN = "PLUGIN"
    MCP = "MCP"


@dataclass(frozen=True)
class Attachment:
    mime: str
    url: str
    filename: str = ""


@dataclass
class ToolResult:
    title: str
    output: str
    metadata: dict[str, Any] = field(default_factory=dict)
    attachments: list[Attachment] = field(default_factory=list)
    spooled: Spooled | None = None
    """Set when the sandbox kept only the head of a huge output (`output`); truncation then uses it."""


class ToolError(ControlPlaneError):
    """A tool call failed; `str(exc)` is exactly the message the model reads."""


@dataclass(frozen=True)
class PermissionAsk:
    permission: str
    patterns: list[str]
    always: list[str]
    metadata: dict[str, Any]
    checks: list[str] = field(default_factory=list)
    """More texts the rules must allow, not shown to whoever replies: what a bash command really runs
    (normalised, see the agent's bash_normalise) where it differs from `patterns`."""
    opaque: bool = False
    """Some command's name is known only when it runs: the strictest rule for `permission` decides too."""


class CallRules(Protocol):
    """The rules behind a call's `ask` (implemented by the permission gate's CallAsks), for a sandbox agent
    that settles the asks they allow near the tool instead of a round trip per ask."""

    async def local_rules(self) -> LocalRules | None:
        """The rules the agent may settle allowed asks by; None when every ask must go up (a hook sees them)."""
        ...

    async def path_rules(self) -> LocalRules:
        """The rules the agent only leaves out denied paths by (it never allows with them)."""
        ...

    async def allowed_elsewhere(self, permission: str, patterns: list[str], rules: LocalRules,
                                checks: list[str] | None = None, opaque: bool = False) -> None:
        """Audits and traces an ask the agent allowed by `rules`, as the gate does a rule-allowed ask."""
        ...


class SandboxCalls(Protocol):
    """What a tool may do with its session's sandbox (implemented by the executor)."""

    async def run_builtin(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Runs a built-in tool in the sandbox agent; asks and metadata flow through `ctx`."""
        ...

    async def save_output(self, name: str, content: str) -> str:
        """Writes a full tool output inside the sandbox; returns its absolute path there."""
        ...

    async def run_custom(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Runs a custom or plugin tool in the sandbox's tool host."""
        ...

    async def plugin_hook(self, name: str, input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        """Runs the project plugins' hooks of `name` in the sandbox (after the control plane's own)."""
        ...


@dataclass
class ToolContext:
    session_id: str
    message_id: str
    call_id: str
    agent: str
    ask: Callable[[PermissionAsk], Awaitable[None]]
    metadata: Callable[[str | None, dict[str, Any] | None], Awaitable[None]]
    sandbox: SandboxCalls
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for commands the tool runs (the `shell.env` hook's output)."""
    services: SessionServices = field(default_factory=SessionServices)
    """What control-plane tools use beyond the call itself (todos, questions, sub-calls)."""
    rules: CallRules | None = None
    """The rules that decide `ask`, when rules do (the executor's calls): without them every ask of a
    sandbox tool goes up to `ask`."""
    log: Callable[[ToolLogged], None] | None = None
    """Takes the lines a custom tool prints during the call (for its author, not the model)."""


@dataclass(frozen=True)
class InitContext:
    agent: str | None = None


Execute = Callable[[dict[str, Any], ToolContext], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolDefinition:
    description: str
    parameters: type[BaseModel] | None
    """None for a tool that validates its own arguments (custom, plugin and MCP tools)."""
    execute: Execute
    format_validation_error: Callable[[ValidationError], str] | None = None
    json_schema: dict[str, Any] | None = None
    """The schema shown to the model: as the tool's own runtime gave it when `parameters` is None, or
    one `parameters_schema` cannot express (zod `.meta()` keys) that overrides it."""

    def schema(self) -> dict[str, Any]:
        if self.parameters is not None and self.json_schema is None:
            return parameters_schema(self.parameters)
        return dict(self.json_schema or {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolInfo:
    id: str
    init: Callable[[InitContext], Awaitable[ToolDefinition]]
    source: ToolSource = ToolSource.BUILTIN
    origin: str = "builtin"
    init_ms: float | None = None
    """Init time measured where the tool was loaded (a sandbox's tool host), when not measured here."""
