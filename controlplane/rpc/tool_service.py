"""controlplane.v1.ToolService and PermissionService over the tool runtime."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc

from controlplane.core.calls.runtime_sessions import RunningCall
from controlplane.core.calls.tool import Attachment, ToolSource
from controlplane.core.calls.tool_events import (
    CallEvent,
    CallStatus,
    Completed,
    Failed,
    MetadataUpdated,
    PermissionRequested,
    QuestionAsked,
    StateChanged,
    SubCallEvent,
    SubtaskRequested,
)
from controlplane.core.calls.tool_log import ToolLogged
from controlplane.core.calls.tool_runtime import ClientCall, ToolRuntime
from controlplane.core.permissions.asks import Reply
from controlplane.errors import ControlPlaneError, InvalidArgumentError, SandboxLostError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import abort_with, unary
from controlplane.v1 import tool_pb2, tool_pb2_grpc

_SOURCE = {
    ToolSource.BUILTIN: tool_pb2.ToolDefinition.BUILTIN,
    ToolSource.CUSTOM: tool_pb2.ToolDefinition.CUSTOM,
    ToolSource.PLUGIN: tool_pb2.ToolDefinition.PLUGIN,
    ToolSource.MCP: tool_pb2.ToolDefinition.MCP,
}
_STATUS = {
    CallStatus.PENDING: tool_pb2.ToolState.PENDING,
    CallStatus.RUNNING: tool_pb2.ToolState.RUNNING,
    CallStatus.COMPLETED: tool_pb2.ToolState.COMPLETED,
    CallStatus.ERROR: tool_pb2.ToolState.ERROR,
}
REPLIES: dict[int, Reply] = {
    tool_pb2.PermissionReply.ONCE: Reply.ONCE,
    tool_pb2.PermissionReply.ALWAYS: Reply.ALWAYS,
    tool_pb2.PermissionReply.REJECT: Reply.REJECT,
}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _attachment(a: Attachment) -> tool_pb2.Attachment:
    return tool_pb2.Attachment(type="file", mime=a.mime, url=a.url, filename=a.filename)


def permission_request(r: PermissionRequested) -> tool_pb2.PermissionRequest:
    return tool_pb2.PermissionRequest(
        id=r.id, permission=r.permission, patterns=r.patterns, always=r.always, metadata_json=_json(r.metadata)
    )


def tool_log(line: ToolLogged) -> tool_pb2.ToolLog:
    return tool_pb2.ToolLog(origin=line.origin, level=line.level, text=line.text, call_id=line.call_id, at=line.at)


def tool_event(call_id: str, seq: int, event: CallEvent) -> tool_pb2.ToolEvent:
    if isinstance(event, StateChanged):
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, state=tool_pb2.ToolState(status=_STATUS[event.status]))
    if isinstance(event, MetadataUpdated):
        meta = tool_pb2.ToolMetadata(
            title=event.title or "", metadata_json=_json(event.metadata) if event.metadata is not None else ""
        )
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, metadata=meta)
    if isinstance(event, PermissionRequested):
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, permission_request=permission_request(event))
    if isinstance(event, Completed):
        r = event.result
        result = tool_pb2.ToolResult(
            title=r.title, output=r.output, metadata_json=_json(r.metadata),
            attachments=[_attachment(a) for a in r.attachments],
        )
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, result=result)
    if isinstance(event, SubtaskRequested):
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, subtask=subtask(event))
    if isinstance(event, QuestionAsked):
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, question=question_message(event))
    if isinstance(event, SubCallEvent):
        return tool_event(event.call_id, seq, event.event)
    if isinstance(event, ToolLogged):
        return tool_pb2.ToolEvent(call_id=call_id, seq=seq, log=tool_log(event))
    assert isinstance(event, Failed)
    return tool_pb2.ToolEvent(call_id=call_id, seq=seq, error=tool_pb2.ToolError(message=event.message))


MAX_EVENT_BYTES = 48 * 1024 * 1024
"""Largest tool event sent to a client (the server's default message limit is 64 MiB): outputs are truncated long
before this, but a tool's metadata or attachments are not, and a message over the limit would break the stream."""


def within_message_limit(event: tool_pb2.ToolEvent, limit: int = MAX_EVENT_BYTES) -> tool_pb2.ToolEvent:
    """`event`, or when it is too large for one message: a live metadata update without its metadata, a result
    replaced by the call's error saying so."""
    size = event.ByteSize()
    if size <= limit:
        return event
    kind = event.WhichOneof("event")
    if kind == "metadata":
        return tool_pb2.ToolEvent(call_id=event.call_id, seq=event.seq,
                                  metadata=tool_pb2.ToolMetadata(title=event.metadata.title))
    message = (f"The tool's result is {size >> 20} MiB, larger than the {limit >> 20} MiB one message may carry;"
               " ask for less (a smaller file, a narrower range)")
    return tool_pb2.ToolEvent(call_id=event.call_id, seq=event.seq, error=tool_pb2.ToolError(message=message))


def question_message(q: QuestionAsked) -> tool_pb2.Question:
    return tool_pb2.Question(id=q.id, questions_json=_json(q.questions))


def subtask(r: SubtaskRequested) -> tool_pb2.Subtask:
    return tool_pb2.Subtask(
        session_id=r.session_id, parent_session_id=r.parent_session_id, agent=r.agent, prompt=r.prompt,
        description=r.description, model_json=_json(r.model) if r.model is not None else "", command=r.command,
        resumed=r.resumed,
    )


def reply_of(value: int) -> Reply:
    try:
        return REPLIES[value]
    except KeyError:
        raise InvalidArgumentError("reply must be ONCE, ALWAYS or REJECT") from None


class ToolService(tool_pb2_grpc.ToolServiceServicer):
    def __init__(self, runtime: ToolRuntime, auth: Authenticator) -> None:
        self._runtime = runtime
        self._auth = auth

    @unary
    async def ListTools(self, request: tool_pb2.ListToolsRequest, context: Any) -> tool_pb2.ListToolsResponse:
        tenant = self._auth.tenant_of(context)
        listing = await self._runtime.list_tools(
            tenant.name, request.session_id, request.provider_id, request.model_id, request.agent
        )
        return tool_pb2.ListToolsResponse(
            tools=[
                tool_pb2.ToolDefinition(
                    id=t.id, description=t.description, parameters_json_schema=_json(t.parameters_schema),
                    source=_SOURCE[t.source], origin=t.origin, init_ms=t.init_ms,
                )
                for t in listing.tools
            ],
            load_errors=[tool_pb2.LoadError(origin=o, message=m) for o, m in listing.load_errors],
            logs=[tool_log(line) for line in listing.logs],
        )

    async def ExecuteTool(
        self, request_iterator: AsyncIterator[tool_pb2.ExecuteToolRequest], context: Any
    ) -> AsyncIterator[tool_pb2.ToolEvent]:
        requests = aiter(request_iterator)
        running: RunningCall | None = None
        pump: asyncio.Task[None] | None = None
        try:
            tenant = self._auth.tenant_of(context)
            first = await anext(requests, None)
            if first is None or first.WhichOneof("msg") != "call":
                raise InvalidArgumentError("the first ExecuteTool message must be `call`")
            c = first.call
            if not c.session_id or not c.tool:
                raise InvalidArgumentError("call.session_id and call.tool are required")
            running = await self._runtime.start_call(ClientCall(
                tenant.name, c.session_id, c.tool, c.args_json, call_id=c.call_id, message_id=c.message_id,
                agent=c.agent,
            ))
            pump = asyncio.ensure_future(self._relay(requests, running, tenant.name))
            seq = 0
            while (event := await running.events.get()) is not None:
                seq += 1
                yield within_message_limit(tool_event(running.call_id, seq, event))
        except SandboxLostError as exc:
            await abort_with(context, exc)
        except ControlPlaneError as exc:
            await abort_with(context, exc)
        finally:
            if pump is not None:
                pump.cancel()
            if running is not None and running.task is not None and not running.task.done():
                running.abort.set()  # the client went away: that is an abort

    async def _relay(
        self, requests: AsyncIterator[tool_pb2.ExecuteToolRequest], running: RunningCall, tenant: str
    ) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            async for request in requests:
                kind = request.WhichOneof("msg")
                if kind == "abort":
                    running.abort.set()
                elif kind == "permission_reply":
                    r = request.permission_reply
                    with contextlib.suppress(ControlPlaneError):
                        await self._runtime.reply_permission(tenant, r.request_id, reply_of(r.reply), r.message)
                elif kind == "question_reply":
                    q = request.question_reply
                    answers = [list(a.labels) for a in q.answers]
                    with contextlib.suppress(ControlPlaneError):
                        await self._runtime.reply_question(tenant, q.request_id, answers, q.dismissed)
                elif kind == "subtask_result":
                    done = request.subtask_result
                    with contextlib.suppress(ControlPlaneError):
                        self._runtime.subtasks.complete(tenant, done.session_id, done.text, done.error)

    @unary
    async def CancelToolCall(
        self, request: tool_pb2.CancelToolCallRequest, context: Any
    ) -> tool_pb2.CancelToolCallResponse:
        tenant = self._auth.tenant_of(context)
        cancelled = await self._runtime.cancel(tenant.name, request.session_id, request.call_id)
        return tool_pb2.CancelToolCallResponse(cancelled=cancelled)

    @unary
    async def ReloadTools(self, request: tool_pb2.ReloadToolsRequest, context: Any) -> tool_pb2.ReloadToolsResponse:
        tenant = self._auth.tenant_of(context)
        if not request.session_id:
            raise InvalidArgumentError("session_id is required")
        report = await self._runtime.reload_tools(tenant.name, request.session_id)
        return tool_pb2.ReloadToolsResponse(
            added_tools=report.added, changed_tools=report.changed, removed_tools=report.removed,
            added_files=report.files.added, changed_files=report.files.changed, removed_files=report.files.removed,
            load_errors=[tool_pb2.LoadError(origin=o, message=m) for o, m in report.load_errors],
        )

    @unary
    async def CompleteSubtask(
        self, request: tool_pb2.CompleteSubtaskRequest, context: Any
    ) -> tool_pb2.CompleteSubtaskResponse:
        tenant = self._auth.tenant_of(context)
        self._runtime.subtasks.complete(tenant.name, request.session_id, request.text, request.error)
        return tool_pb2.CompleteSubtaskResponse()
