"""What the clients return and take: `ToolOutcome` and its typed views, `Completed`, the handler types.

Kept apart from the transport so that the sync client, `controlplane.formats` and tests use them without a
channel.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from controlplane.v1 import tool_pb2

A = TypeVar("A")
R = TypeVar("R")

PermissionRequest = tool_pb2.PermissionRequest
Reply = tool_pb2.PermissionReply.Reply
Question = tool_pb2.Question
Subtask = tool_pb2.Subtask
ToolEvent = tool_pb2.ToolEvent

PermissionAnswer = Callable[[PermissionRequest], Awaitable[tuple[int, str]] | tuple[int, str]]
"""Decides a permission request: (ONCE|ALWAYS|REJECT, message). May be a plain function or a coroutine one."""
QuestionAnswerer = Callable[[Question], Awaitable[list[list[str]] | None] | list[list[str]] | None]
"""Answers a question request: one list of labels per asked question, or None to dismiss it."""
SubtaskRunner = Callable[[Subtask], Awaitable[str] | str]
"""Runs a subagent's loop in the subtask's child session; returns its final text (raising fails the task)."""
EventHandler = Callable[[ToolEvent], Awaitable[None] | None]
"""Sees every event of a call (state, metadata, permission, question, subtask, result, error) in stream order."""

NO_PERMISSION_HANDLER = (
    "permission rejected by the client: execute_tool was called without on_permission. Pass "
    "on_permission= (a function of the PermissionRequest returning (Reply.ONCE|ALWAYS|REJECT, message); "
    "controlplane.client.allow_once approves everything once) to answer permission requests"
)
"""The default answer's message. Approving by default let a first agent loop read `.env` without anyone
deciding it; a rejection that names the parameter costs one line to fix."""


async def call_handler(handler: Callable[[A], Awaitable[R] | R], value: A) -> R:
    """Calls a handler that may be a plain function or a coroutine function."""
    result = handler(value)
    if inspect.isawaitable(result):
        return await result
    return result


async def reject_unanswered(_: PermissionRequest) -> tuple[int, str]:
    return tool_pb2.PermissionReply.REJECT, NO_PERMISSION_HANDLER


async def allow_once(_: PermissionRequest) -> tuple[int, str]:
    return tool_pb2.PermissionReply.ONCE, ""


@dataclass(frozen=True)
class Completed:
    """A command run to its end."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    signal: int = 0
    timed_out: bool = False
    aborted: bool = False


@dataclass(frozen=True)
class FileAttachment:
    """A result's attachment decoded from its data URL."""

    mime: str
    data: bytes
    filename: str = ""


def decode_attachment(attachment: tool_pb2.Attachment) -> FileAttachment:
    url = attachment.url
    header, sep, payload = url.partition(",")
    if not url.startswith("data:") or not sep:
        raise ValueError(f"attachment {attachment.filename or '?'}: not a data URL")
    mime = header[len("data:"):].split(";", 1)[0] or attachment.mime
    try:
        data = base64.b64decode(payload, validate=True) if header.endswith(";base64") else payload.encode()
    except binascii.Error as exc:
        raise ValueError(f"attachment {attachment.filename or '?'}: bad base64 ({exc})") from exc
    return FileAttachment(attachment.mime or mime, data, attachment.filename)


@dataclass
class ToolOutcome:
    """A finished tool call: exactly one of `result` and `error` is set."""

    call_id: str
    result: tool_pb2.ToolResult | None
    error: str | None
    events: list[tool_pb2.ToolEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result is not None

    @property
    def output(self) -> str:
        if self.result is None:
            raise AssertionError(f"the call failed: {self.error}")
        return self.result.output

    @property
    def title(self) -> str:
        return self.result.title if self.result is not None else ""

    @property
    def metadata(self) -> dict[str, Any]:
        if self.result is None:
            raise AssertionError(f"the call failed: {self.error}")
        value: dict[str, Any] = json.loads(self.result.metadata_json or "{}")
        return value

    @property
    def attachments(self) -> list[FileAttachment]:
        """The result's attachments as bytes with their mime type (none for a failed call)."""
        if self.result is None:
            return []
        return [decode_attachment(a) for a in self.result.attachments]

    @property
    def text(self) -> str:
        """What a model is shown: the output, or the error's message."""
        return self.result.output if self.result is not None else self.error or ""

    @property
    def questions(self) -> list[tool_pb2.Question]:
        return [e.question for e in self.events if e.WhichOneof("event") == "question"]

    def of_call(self, call_id: str) -> list[tool_pb2.ToolEvent]:
        """The events of one call on this stream (a `batch` entry's, by its call id)."""
        return [e for e in self.events if e.call_id == call_id]

    @property
    def permission_requests(self) -> list[tool_pb2.PermissionRequest]:
        return [e.permission_request for e in self.events if e.WhichOneof("event") == "permission_request"]
