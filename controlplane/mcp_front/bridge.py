"""A session's tools as an MCP server (the official SDK's low-level `Server`), through the public gRPC API.

Both front ends (stdio in `controlplane mcp`, streamable HTTP in the control plane) are clients of the
gRPC API with the caller's own token: tenancy, permissions, quotas and audit are the API's, never
re-implemented here. What MCP adds is a mapping:

- `tools/list` is ListTools, in the registry's order, each schema as the registry gives it.
- `tools/call` is one ExecuteTool stream. Live metadata becomes progress notifications (when the client
  asked for progress); the call's result or error becomes the tool result (`isError` for an error).
- A permission ask becomes a form elicitation (accept: allow once, or always when the form says so;
  decline or cancel: reject) when the client declared elicitation; otherwise it is rejected, and the tool
  result says why and how to allow it. On the 2026 protocol, where a server cannot send a request in the
  middle of a call, the ask is an `InputRequiredResult`: the running call is parked under an unguessable
  state token bound to the caller's credential, and the client's retry with the answer resumes it.
- Cancelling the MCP request cancels the gRPC stream, which aborts the call in the sandbox.
- A `question` is dismissed and a `task`'s subtask refused: MCP has no way to run a subagent's loop, and a
  question's answers are labels a form cannot carry faithfully.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError

from controlplane.cli_common import rerouted
from controlplane.client import AsyncClient
from controlplane.v1 import tool_pb2

log = logging.getLogger(__name__)

Target = Callable[[ServerRequestContext[Any, Any]], Awaitable[tuple[AsyncClient, str, str]]]
"""Finds, for one MCP request, (a client with the caller's token, the platform session id, the caller's key). The
client stays the front end's: calls use it, never close it."""
PERMISSION_KEY = "permission"
PARKED_TTL_S = 600.0
"""How long a call parked on a 2026-protocol ask waits for the client's retry before it is aborted."""
ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "always": {"type": "boolean", "title": "Always allow matching requests in this session", "default": False},
    },
}
NO_ELICITATION = ("the MCP client cannot be asked (it declared no elicitation support), so the ask was rejected; "
                  "allow it with a rule in the session's opencode.json `permission`, or use a client that supports "
                  "elicitation")


@dataclass
class _Call:
    """One ExecuteTool stream, possibly outliving the MCP request that started it (a parked 2026 ask)."""

    owner: str
    stream: Any
    outbox: asyncio.Queue[tool_pb2.ExecuteToolRequest | None]
    events: AsyncIterator[tool_pb2.ToolEvent]
    top: str = ""
    asked: tool_pb2.PermissionRequest | None = None
    shown: str = ""
    progress: int = 0

    async def finish(self, *, abort: bool) -> None:
        self.outbox.put_nowait(None)
        if abort:
            self.stream.cancel()


class SessionTools:
    """The MCP server of the front end; `target` says which session and token each request is for."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._parked: dict[str, _Call] = {}
        self._expiring: set[asyncio.Task[None]] = set()
        self.server: Server[Any] = Server(
            "ocsandbox", version="1", on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            instructions="Tools of one sandboxed OpenCode session: they run in its container, under its permissions.",
        )

    async def close(self) -> None:
        parked, self._parked = self._parked, {}
        for call in parked.values():
            await call.finish(abort=True)

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], _: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        client, session_id, _owner = await self._target(ctx)
        try:
            listing = await client.list_tools(session_id)
        except grpc.aio.AioRpcError as exc:
            raise _mcp_error(exc) from exc
        return types.ListToolsResult(tools=[
            types.Tool(name=t.id, description=t.description, input_schema=json.loads(t.parameters_json_schema or "{}"))
            for t in listing.tools
        ])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult | types.InputRequiredResult:
        if params.request_state is not None:
            return await self._resume(ctx, params)
        client, session_id, owner = await self._target(ctx)
        stream, outbox = client.tool_call(session_id, params.name, params.arguments or {})
        call = _Call(owner, stream, outbox, stream.__aiter__())
        return await self._drive(ctx, call)

    async def _resume(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                      ) -> types.CallToolResult | types.InputRequiredResult:
        _client, _session_id, owner = await self._target(ctx)
        state = params.request_state or ""
        call = self._parked.get(state)
        # Another caller's state (or a made-up one) is as unknown as an expired one.
        if call is None or not secrets.compare_digest(call.owner, owner):
            raise MCPError(types.INVALID_PARAMS, "unknown or expired request state: call the tool again")
        del self._parked[state]
        answer = (params.input_responses or {}).get(PERMISSION_KEY)
        assert call.asked is not None
        self._reply(call, call.asked, answer if isinstance(answer, types.ElicitResult) else None, asked=True)
        return await self._drive(ctx, call)

    async def _drive(self, ctx: ServerRequestContext[Any, Any], call: _Call
                     ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            async for event in call.events:
                call.top = call.top or event.call_id
                kind = event.WhichOneof("event")
                if kind == "metadata":
                    await self._progress(ctx, call, event.metadata)
                elif kind == "permission_request":
                    request = event.permission_request
                    if not _can_elicit(ctx):
                        self._reply(call, request, None, asked=False)
                    elif ctx.session.can_send_request:
                        answer = await ctx.session.elicit_form(_ask_text(request), ELICIT_SCHEMA, ctx.request_id)
                        self._reply(call, request, answer, asked=True)
                    else:
                        return self._park(call, request)
                elif kind == "question":
                    reply = tool_pb2.QuestionReply(request_id=event.question.id, dismissed=True)
                    call.outbox.put_nowait(tool_pb2.ExecuteToolRequest(question_reply=reply))
                elif kind == "subtask":
                    result = tool_pb2.SubtaskResult(session_id=event.subtask.session_id,
                                                    error="an MCP client cannot run a subagent's loop")
                    call.outbox.put_nowait(tool_pb2.ExecuteToolRequest(subtask_result=result))
                elif kind in ("result", "error") and event.call_id != call.top:
                    continue  # a batch entry's end, not the call's
                elif kind == "result":
                    await call.finish(abort=False)
                    return _result(event.result, is_error=rerouted(event.result))
                elif kind == "error":
                    await call.finish(abort=False)
                    return types.CallToolResult(content=[types.TextContent(text=event.error.message)], is_error=True)
            raise MCPError(types.INTERNAL_ERROR, "the tool call's stream ended without a result")
        except BaseException as exc:
            # Cancelled by the client (notifications/cancelled) or failed: the call must not run on.
            await asyncio.shield(call.finish(abort=True))
            if isinstance(exc, grpc.aio.AioRpcError):
                raise _mcp_error(exc) from exc
            raise

    def _park(self, call: _Call, request: tool_pb2.PermissionRequest) -> types.InputRequiredResult:
        state = secrets.token_urlsafe(32)
        call.asked = request
        self._parked[state] = call
        asyncio.get_running_loop().call_later(PARKED_TTL_S, self._expire_one, state, call)
        ask = types.ElicitRequest(params=types.ElicitRequestFormParams(
            message=_ask_text(request), requested_schema=ELICIT_SCHEMA))
        return types.InputRequiredResult(input_requests={PERMISSION_KEY: ask}, request_state=state)

    def _expire_one(self, state: str, call: _Call) -> None:
        # The client never came back with an answer: the call must not hold its sandbox and quota forever.
        if self._parked.get(state) is call:
            del self._parked[state]
            task = asyncio.ensure_future(call.finish(abort=True))
            self._expiring.add(task)
            task.add_done_callback(self._expiring.discard)

    @staticmethod
    def _reply(call: _Call, request: tool_pb2.PermissionRequest, answer: types.ElicitResult | None, *,
               asked: bool) -> None:
        call.asked = None
        if answer is not None and answer.action == "accept":
            always = bool((answer.content or {}).get("always"))
            reply = tool_pb2.PermissionReply.ALWAYS if always else tool_pb2.PermissionReply.ONCE
            message = ""
        else:
            reply = tool_pb2.PermissionReply.REJECT
            message = (f"the MCP client's user answered {answer.action if answer else 'nothing'}" if asked
                       else NO_ELICITATION)
        answer_message = tool_pb2.PermissionReply(request_id=request.id, reply=reply, message=message)
        call.outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=answer_message))

    @staticmethod
    async def _progress(ctx: ServerRequestContext[Any, Any], call: _Call, metadata: tool_pb2.ToolMetadata) -> None:
        if ctx.meta is None or ctx.meta.get("progress_token") is None:
            return
        try:
            fields = json.loads(metadata.metadata_json or "{}")
        except json.JSONDecodeError:
            fields = {}
        output = fields.get("output") if isinstance(fields, dict) else None
        text = metadata.title
        if isinstance(output, str):
            # bash's metadata carries its output so far: the notification carries what is new.
            text = output[len(call.shown):] if output.startswith(call.shown) else output
            call.shown = output
        call.progress += 1
        with contextlib.suppress(Exception):  # a progress note that cannot be sent must not fail the call
            await ctx.session.report_progress(call.progress, None, text or None)


def owner_key(token: str, session_id: str) -> str:
    """Who may resume a parked call: the credential and the session, never the token itself."""
    return hashlib.sha256(f"{session_id}\0{token}".encode()).hexdigest()


def _can_elicit(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def _ask_text(request: tool_pb2.PermissionRequest) -> str:
    patterns = ", ".join(request.patterns) or "*"
    return f"Allow {request.permission} for {patterns}?"


def _result(result: tool_pb2.ToolResult, *, is_error: bool) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(text=result.output)]
    for attachment in result.attachments:
        head, _, data = attachment.url.partition(",")
        if attachment.mime.startswith("image/") and head.endswith(";base64"):
            content.append(types.ImageContent(data=data, mime_type=attachment.mime))
    metadata = json.loads(result.metadata_json or "{}")
    return types.CallToolResult.model_validate({
        "content": [c.model_dump(by_alias=True, exclude_none=True) for c in content],
        "_meta": {"title": result.title, "metadata": metadata},
        "isError": is_error,
    })


def _mcp_error(exc: grpc.aio.AioRpcError) -> MCPError:
    code = types.INVALID_PARAMS if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT) \
        else types.INTERNAL_ERROR
    return MCPError(code, f"{exc.code().name}: {exc.details()}")
