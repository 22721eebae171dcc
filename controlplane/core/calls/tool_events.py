"""What a tool call reports while it runs, independent of the wire format."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from controlplane.core.calls.tool import ToolResult
from controlplane.core.calls.tool_log import ToolLogged


class CallStatus(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"


@dataclass(frozen=True)
class StateChanged:
    status: CallStatus


@dataclass(frozen=True)
class MetadataUpdated:
    title: str | None
    metadata: dict[str, Any] | None


@dataclass(frozen=True)
class PermissionRequested:
    id: str
    session_id: str
    permission: str
    patterns: list[str]
    always: list[str]
    metadata: dict[str, Any]
    call_id: str = ""
    message_id: str = ""
    checks: list[str] = field(default_factory=list)
    """PermissionAsk.checks: evaluated with `patterns`, never published."""
    opaque: bool = False
    """PermissionAsk.opaque."""


@dataclass(frozen=True)
class Completed:
    result: ToolResult


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass(frozen=True)
class SubtaskRequested:
    """A `task` call needs the client to run a subagent in the child session `session_id`."""

    session_id: str
    parent_session_id: str
    agent: str
    prompt: str
    description: str
    model: dict[str, Any] | None = None
    command: str = ""
    resumed: bool = False
    """The child session existed (the call named its `task_id`): its history continues."""


@dataclass(frozen=True)
class QuestionAsked:
    """The tool waits for the user's answers to `questions` (see core/questions.py)."""

    id: str
    session_id: str
    questions: list[dict[str, Any]]
    call_id: str = ""
    message_id: str = ""


@dataclass(frozen=True)
class SubCallEvent:
    """An event of a call run on behalf of the streamed one (a `batch` entry), under its own id."""

    call_id: str
    tool: str
    event: CallEvent


CallEvent = (
    StateChanged | MetadataUpdated | PermissionRequested | Completed | Failed | SubtaskRequested | QuestionAsked
    | SubCallEvent | ToolLogged
)
