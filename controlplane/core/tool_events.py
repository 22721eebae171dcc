"""What a tool call reports while it runs, independent of the wire format."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from controlplane.core.tool import ToolResult


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


@dataclass(frozen=True)
class Completed:
    result: ToolResult


@dataclass(frozen=True)
class Failed:
    message: str


CallEvent = StateChanged | MetadataUpdated | PermissionRequested | Completed | Failed
