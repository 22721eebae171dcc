"""A typed client for the public API: `connect()` and `AsyncClient`; `Client` (sync_client.py) for synchronous
callers, method for method. What they return and the handler types are in client_types.py; docs/agent-developers.md
walks through them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from opentelemetry import propagate, trace

from controlplane.client_files import AsyncFiles
from controlplane.client_snapshots import AsyncSnapshots
from controlplane.client_types import (
    Completed,
    EventHandler,
    FileAttachment,
    PermissionAnswer,
    PermissionRequest,
    Question,
    QuestionAnswerer,
    Reply,
    Subtask,
    SubtaskRunner,
    ToolOutcome,
    allow_once,
    call_handler,
    reject_unanswered,
)
from controlplane.core.tenants.records import token_too_long
from controlplane.errors import InvalidArgumentError
from controlplane.stream_accept import accepted, ended
from controlplane.v1 import (
    event_pb2,
    event_pb2_grpc,
    permission_pb2,
    permission_pb2_grpc,
    question_pb2,
    question_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
)
from controlplane.workspace_dir import DEFAULT_MAX_BYTES, archive_directory

__all__ = [
    "AsyncClient", "Client", "Completed", "EventHandler", "FileAttachment", "PermissionAnswer", "PermissionRequest",
    "Question", "QuestionAnswerer", "Reply", "Session", "Subtask", "SubtaskRunner", "ToolOutcome", "allow_once",
    "connect",
]

T = TypeVar("T")
Session = session_pb2.Session
ExecEvent = sandbox_pb2.ExecEvent
ToolEvent = tool_pb2.ToolEvent


def connect(
    target: str | None = None, token: str | None = None, *, config: Path | None = None,
    root_certificates: bytes | None = None,
) -> AsyncClient:
    """A client for the control plane found as the CLI finds it (`controlplane.discovery`): the arguments,
    then CONTROLPLANE_TARGET / CONTROLPLANE_TOKEN, then the data dir of a server started on this machine.
    Use it as `async with connect() as client:`."""
    # Imported here: it reads the operator's settings (pydantic), which a client given its target never needs.
    from controlplane.discovery import find_endpoint

    found_target, found_token = find_endpoint(target, token, config=config)
    return AsyncClient(found_target, found_token, root_certificates=root_certificates)


def workspace_bytes(workspace: Path | bytes | None, workspace_archive: bytes, max_bytes: int) -> bytes:
    """The archive CreateSession takes: `workspace` a directory (archived here), a tar file, or its bytes."""
    if workspace is not None and workspace_archive:
        raise InvalidArgumentError("pass workspace= or workspace_archive=, not both")
    if workspace is None:
        return workspace_archive
    if isinstance(workspace, bytes | bytearray):
        return bytes(workspace)
    path = Path(workspace)
    if path.is_dir():
        return archive_directory(path, max_bytes=max_bytes)
    if path.is_file():
        if path.stat().st_size > max_bytes:
            raise InvalidArgumentError(f"workspace archive {path} is larger than {max_bytes} bytes (max_bytes=)")
        return path.read_bytes()
    raise InvalidArgumentError(f"workspace {path}: no such directory or archive")


def sendable_token(token: str) -> str:
    """`token`, or a clear local error when the server would refuse it for its length alone (a much longer
    one would not even reach its authenticator: the transport's header limit answers first)."""
    too_long = token_too_long(token)
    if too_long:
        raise InvalidArgumentError(f"{too_long}; check that the token file holds the token alone")
    return token


class AsyncClient(AsyncFiles, AsyncSnapshots):
    """`target` is host:port; `token` the tenant's bearer token."""

    def __init__(self, target: str, token: str, *, root_certificates: bytes | None = None) -> None:
        sendable_token(token)
        options = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
                   ("grpc.max_send_message_length", 256 * 1024 * 1024)]
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates)
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._auth = (("authorization", f"Bearer {token}"),)
        self.sessions = session_pb2_grpc.SessionServiceStub(self._channel)
        self.sandbox = sandbox_pb2_grpc.SandboxServiceStub(self._channel)
        self.tools = tool_pb2_grpc.ToolServiceStub(self._channel)
        self.permissions = permission_pb2_grpc.PermissionServiceStub(self._channel)
        self.questions = question_pb2_grpc.QuestionServiceStub(self._channel)
        self.events = event_pb2_grpc.EventServiceStub(self._channel)

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The bearer token, plus the caller's trace context while a span records (the trace goes on server-side)."""
        if not trace.get_current_span().is_recording():
            return self._auth
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return self._auth + tuple(carrier.items())

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def create_session(
        self, *, agent: str = "", workspace: Path | bytes | None = None, workspace_archive: bytes = b"",
        config_json: str = "", labels: dict[str, str] | None = None, cpu: float = 0, memory_mb: int = 0,
        pids: int = 0, deadline_s: float | None = 120, max_workspace_bytes: int = DEFAULT_MAX_BYTES,
        template: str = "",
        network_allow: Iterable[str] = (), from_snapshot: str = "",
    ) -> Session:
        """`workspace` is a directory (archived without following its symlinks, at most `max_workspace_bytes`),
        a tar(.gz) file, or archive bytes; `workspace_archive` (bytes) is the older spelling of the last.
        `template` names one of `list_templates()` (empty: the default sandbox image). `network_allow` gives the
        session's tools a network through the plane's proxy: host patterns (`host`, `*.domain`, optionally
        `:port`) and CIDRs (an entry with a `/`), within the tenant's cap. `from_snapshot` restores a snapshot
        (`snapshot()`): its workspace and state, so only the resources may be given beside it."""
        archive = workspace_bytes(workspace, workspace_archive, max_workspace_bytes)
        request = session_pb2.CreateSessionRequest(
            agent=agent, workspace_archive=archive, config_json=config_json, labels=labels or {}, template=template,
            from_snapshot=from_snapshot,
        )
        if cpu or memory_mb or pids:
            request.resources.CopyFrom(session_pb2.Resources(cpu=cpu, memory_mb=memory_mb, pids=pids))
        if network_allow:
            request.network.CopyFrom(network_policy(network_allow))
        return await self.sessions.CreateSession(request, metadata=self._metadata, timeout=deadline_s)

    async def get_session(self, session_id: str) -> Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return await self.sessions.GetSession(request, metadata=self._metadata)

    async def list_sessions(self, include_deleted: bool = False) -> list[Session]:
        request = session_pb2.ListSessionsRequest(include_deleted=include_deleted)
        response = await self.sessions.ListSessions(request, metadata=self._metadata)
        return list(response.sessions)

    async def delete_session(self, session_id: str, *, keep_snapshot: bool = False) -> Session:
        """`keep_snapshot`: its workspace and state stay as a retained snapshot (`delete_keeping` returns it)."""
        request = session_pb2.DeleteSessionRequest(session_id=session_id, keep_snapshot=keep_snapshot)
        return (await self.sessions.DeleteSession(request, metadata=self._metadata)).session

    async def list_templates(self) -> list[session_pb2.Template]:
        """The templates this tenant may name in `create_session(template=...)`, with their states."""
        response = await self.sessions.ListTemplates(session_pb2.ListTemplatesRequest(), metadata=self._metadata)
        return list(response.templates)

    def exec_call(
        self, session_id: str, argv: Iterable[str] = (), *, command: str = "", cwd: str = "",
        env: dict[str, str] | None = None, timeout_ms: int = 0, merge_stderr: bool = False,
        stdin: AsyncIterator[bytes] | None = None,
    ) -> grpc.aio.StreamStreamCall[sandbox_pb2.ExecRequest, sandbox_pb2.ExecEvent]:
        """The raw call: iterate it for events, `cancel()` it to abort the command."""
        start = sandbox_pb2.ExecStart(
            session_id=session_id, argv=list(argv), command=command, cwd=cwd, env=env or {},
            timeout_ms=timeout_ms, merge_stderr=merge_stderr, stdin=stdin is not None,
        )

        async def requests() -> AsyncIterator[sandbox_pb2.ExecRequest]:
            if not await accepted(call):
                return  # refused: writing now would turn the server's status into a local INTERNAL
            yield sandbox_pb2.ExecRequest(start=start)
            if stdin is not None:
                async for data in stdin:
                    if await ended(call):
                        return
                    yield sandbox_pb2.ExecRequest(stdin=data)
                if not await ended(call):
                    yield sandbox_pb2.ExecRequest(close_stdin=True)
            # Returning half-closes the request side; the command keeps running until `exited`.

        call = self.sandbox.Exec(requests(), metadata=self._metadata)
        return call

    async def exec(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> AsyncIterator[ExecEvent]:
        """Events of one command, ending with `exited`."""
        call = self.exec_call(session_id, argv, **kwargs)
        try:
            async for event in call:
                yield event
                if event.WhichOneof("event") == "exited":
                    return
        finally:
            call.cancel()

    async def run(self, session_id: str, argv: Iterable[str] = (), **kwargs: Any) -> Completed:
        """Runs a command to completion and collects its output."""
        out, err = bytearray(), bytearray()
        completed: Completed | None = None
        # Read on past `exited`: `exec` ends right after it, instead of being closed later by a task of its own.
        async for event in self.exec(session_id, argv, **kwargs):
            kind = event.WhichOneof("event")
            if kind == "stdout":
                out += event.stdout
            elif kind == "stderr":
                err += event.stderr
            elif kind == "exited":
                e = event.exited
                completed = Completed(e.exit_code, bytes(out), bytes(err), e.signal, e.timed_out, e.aborted)
        if completed is None:
            raise RuntimeError("the command's stream ended without an exit status")
        return completed

    # -- tools ----------------------------------------------------------------------------------

    async def list_tools(
        self, session_id: str, *, provider_id: str = "", model_id: str = "", agent: str = ""
    ) -> tool_pb2.ListToolsResponse:
        request = tool_pb2.ListToolsRequest(
            session_id=session_id, provider_id=provider_id, model_id=model_id, agent=agent
        )
        return await self.tools.ListTools(request, metadata=self._metadata)

    def tool_call(
        self, session_id: str, tool: str, args: dict[str, Any] | str, *, call_id: str = "", message_id: str = "",
        agent: str = "",
    ) -> tuple[grpc.aio.StreamStreamCall[tool_pb2.ExecuteToolRequest, tool_pb2.ToolEvent],
               asyncio.Queue[tool_pb2.ExecuteToolRequest | None]]:
        """The raw call plus its request queue (put replies or an abort; None half-closes)."""
        args_json = args if isinstance(args, str) else json.dumps(args)
        call = tool_pb2.ToolCall(
            session_id=session_id, tool=tool, args_json=args_json, call_id=call_id, message_id=message_id,
            agent=agent,
        )
        outbox: asyncio.Queue[tool_pb2.ExecuteToolRequest | None] = asyncio.Queue()
        outbox.put_nowait(tool_pb2.ExecuteToolRequest(call=call))

        async def requests() -> AsyncIterator[tool_pb2.ExecuteToolRequest]:
            if not await accepted(stream):
                return  # refused: writing now would turn the server's status into a local INTERNAL
            while (item := await outbox.get()) is not None:
                if await ended(call=stream):
                    return
                yield item

        stream = self.tools.ExecuteTool(requests(), metadata=self._metadata)
        return stream, outbox

    async def execute_tool(
        self, session_id: str, tool: str, args: dict[str, Any] | str, *, call_id: str = "", message_id: str = "",
        agent: str = "", on_permission: PermissionAnswer | None = None, on_subtask: SubtaskRunner | None = None,
        on_question: QuestionAnswerer | None = None, on_event: EventHandler | None = None,
    ) -> ToolOutcome:
        """Runs one tool call to its end, answering each permission request with `on_permission`.

        Without `on_permission` every permission request is rejected, with a message saying how to answer:
        approving has to be a decision. `on_event` sees every event of the stream (state, metadata with live
        output, permission requests, questions, subtasks, the result or error) in order, before it is
        handled; an exception from it aborts the call. Handlers may be plain or coroutine functions.

        A `task` call's subtask is run with `on_subtask` (concurrently, so this stream keeps being
        served) and its text sent back on the stream; without `on_subtask` someone else must answer
        (CompleteSubtask). Questions are answered with `on_question` (None from it dismisses); without
        it they wait for an answer from another connection (`reply_question`). Events of a `batch`'s
        entries carry their own call ids; the outcome is the streamed call's own result or error.
        """
        decide = on_permission or reject_unanswered
        stream, outbox = self.tool_call(
            session_id, tool, args, call_id=call_id, message_id=message_id, agent=agent
        )
        events: list[tool_pb2.ToolEvent] = []
        finished = False
        subtasks: set[asyncio.Task[None]] = set()
        top = call_id

        async def answer_question(question: Question) -> None:
            assert on_question is not None
            answers = await call_handler(on_question, question)
            reply = tool_pb2.QuestionReply(
                request_id=question.id, dismissed=answers is None,
                answers=[tool_pb2.QuestionAnswer(labels=labels) for labels in answers or []],
            )
            outbox.put_nowait(tool_pb2.ExecuteToolRequest(question_reply=reply))

        async def run_subtask(request: Subtask) -> None:
            assert on_subtask is not None
            try:
                text = await call_handler(on_subtask, request)
                result = tool_pb2.SubtaskResult(session_id=request.session_id, text=text)
            except Exception as exc:  # the subagent failed: the task call reports it
                result = tool_pb2.SubtaskResult(session_id=request.session_id, error=str(exc) or type(exc).__name__)
            outbox.put_nowait(tool_pb2.ExecuteToolRequest(subtask_result=result))

        try:
            async for event in stream:
                events.append(event)
                if on_event is not None:
                    await call_handler(on_event, event)
                top = top or event.call_id  # the streamed call's first event comes before any sub-call's
                kind = event.WhichOneof("event")
                if kind == "permission_request":
                    reply, message = await call_handler(decide, event.permission_request)
                    answer = tool_pb2.PermissionReply(
                        request_id=event.permission_request.id, reply=reply, message=message  # type: ignore[arg-type]
                    )
                    outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=answer))
                elif kind == "question" and on_question is not None:
                    answering = asyncio.ensure_future(answer_question(event.question))
                    subtasks.add(answering)
                    answering.add_done_callback(subtasks.discard)
                elif kind in ("result", "error") and event.call_id != top:
                    continue  # a batch entry's end, not the streamed call's
                elif kind == "subtask" and on_subtask is not None:
                    runner = asyncio.ensure_future(run_subtask(event.subtask))
                    subtasks.add(runner)
                    runner.add_done_callback(subtasks.discard)
                elif kind == "result":
                    finished = True
                    return ToolOutcome(event.call_id, event.result, None, events)
                elif kind == "error":
                    finished = True
                    return ToolOutcome(event.call_id, None, event.error.message, events)
        finally:
            # Half-closing lets the call end by itself; cancelling a finished call would make grpc
            # cancel our request generator mid-await (and format a traceback for its debug log).
            outbox.put_nowait(None)
            if not finished:
                stream.cancel()
            for runner in list(subtasks):
                runner.cancel()
        raise RuntimeError("the tool call's stream ended without a result or an error")

    async def reload_tools(self, session_id: str) -> tool_pb2.ReloadToolsResponse:
        """Takes the workspace's current custom tools, plugins and skills for the session (fixed at create
        otherwise); says which tools and files were added, changed and removed."""
        request = tool_pb2.ReloadToolsRequest(session_id=session_id)
        return await self.tools.ReloadTools(request, metadata=self._metadata)

    async def cancel_tool_call(self, session_id: str, call_id: str) -> bool:
        request = tool_pb2.CancelToolCallRequest(session_id=session_id, call_id=call_id)
        return bool((await self.tools.CancelToolCall(request, metadata=self._metadata)).cancelled)

    async def pending_questions(self, session_id: str) -> list[question_pb2.PendingQuestion]:
        request = question_pb2.ListPendingQuestionsRequest(session_id=session_id)
        return list((await self.questions.ListPendingQuestions(request, metadata=self._metadata)).questions)

    async def reply_question(self, request_id: str, answers: list[list[str]] | None) -> None:
        """Answers a pending question from any connection (one list of labels per question); None dismisses it."""
        request = question_pb2.ReplyQuestionRequest(
            request_id=request_id, dismissed=answers is None,
            answers=[tool_pb2.QuestionAnswer(labels=labels) for labels in answers or []],
        )
        await self.questions.ReplyQuestion(request, metadata=self._metadata)

    async def complete_subtask(self, session_id: str, text: str = "", *, error: str = "") -> None:
        """Answers a subtask from any connection: the subagent's text, or an error that fails the task."""
        request = tool_pb2.CompleteSubtaskRequest(session_id=session_id, text=text, error=error)
        await self.tools.CompleteSubtask(request, metadata=self._metadata)

    # -- permissions and events -----------------------------------------------------------------

    async def pending_permissions(self, session_id: str) -> list[permission_pb2.PendingPermission]:
        request = permission_pb2.ListPendingPermissionsRequest(session_id=session_id)
        return list((await self.permissions.ListPendingPermissions(request, metadata=self._metadata)).requests)

    async def reply_permission(self, request_id: str, reply: str, message: str = "") -> None:
        """`reply` is once, always or reject."""
        value = tool_pb2.PermissionReply.Reply.Value(reply.upper())
        request = permission_pb2.ReplyPermissionRequest(request_id=request_id, reply=value, message=message)
        await self.permissions.ReplyPermission(request, metadata=self._metadata)

    def subscribe_events(self, session_id: str = "", *, recent_logs: bool = False) -> grpc.aio.UnaryStreamCall[
        event_pb2.SubscribeEventsRequest, event_pb2.Event
    ]:
        """The bus of this tenant (of one session when given); iterate it, cancel it to stop. With
        `recent_logs`, the `tool.log` events the control plane still holds come first."""
        request = event_pb2.SubscribeEventsRequest(session_id=session_id, recent_logs=recent_logs)
        return self.events.SubscribeEvents(request, metadata=self._metadata)


from controlplane.sync_client import Client  # noqa: E402  (it imports this module lazily: no cycle)


def network_policy(entries: Iterable[str]) -> session_pb2.NetworkPolicy:
    """`network_allow` as a NetworkPolicy: an entry with a `/` is a CIDR, any other a host pattern."""
    items = [e.strip() for e in entries if e.strip()]
    return session_pb2.NetworkPolicy(allow_hosts=[e for e in items if "/" not in e],
                                     allow_cidrs=[e for e in items if "/" in e])
