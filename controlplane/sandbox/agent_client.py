"""The gRPC client of a sandbox agent (sandbox.v1), turned into domain events."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from controlplane.core.calls.spooled import Spooled
from controlplane.core.calls.tool import ToolError
from controlplane.core.permissions.asks import LocalRules
from controlplane.core.seam.messages import (
    BuiltinCall,
    CodeChanges,
    CommandSpec,
    CustomListing,
    CustomToolSpec,
    ExecEvent,
    Exited,
    Output,
    RunAsk,
    RunEvent,
    RunFailed,
    RunMetadata,
    RunResult,
    Started,
    UploadSummary,
)
from controlplane.core.seam.provider import AgentHealth, BuiltinRun, ExecStream, SandboxAgent
from controlplane.errors import (
    ControlPlaneError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxError,
    SandboxLostError,
)
from controlplane.sandbox.rule_encoding import encode_rules
from controlplane.telemetry.remote import AgentCallSpan
from sandbox.v1 import agent_pb2, agent_pb2_grpc

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A new sandbox's socket appears within milliseconds; the default 1 s backoff would stall us.
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.min_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 200),
]
UPLOAD_CHUNK = 1024 * 1024
_END = object()


def map_agent_error(exc: grpc.aio.AioRpcError, sandbox_id: str) -> ControlPlaneError:
    return _status_error(exc.code(), exc.details() or "", sandbox_id)


AGENT_FAULTS = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.DATA_LOSS, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS,
                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED)
"""Statuses an agent that is still there ends a call with (an exception it did not expect): that call failed,
the sandbox did not. Only a dead channel (UNAVAILABLE, a cancelled or timed-out stream) may mean it is gone."""


def _status_error(code: grpc.StatusCode, details: str, sandbox_id: str) -> ControlPlaneError:
    """Agent statuses are a closed set; an unexpected failure fails the call; anything else may mean the sandbox is
    gone (the session manager checks that it really is before failing the session)."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPreconditionError(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhaustedError(details)
    if code in AGENT_FAULTS:
        return SandboxError(f"the sandbox agent failed this call ({code.name}: {details})")
    return SandboxLostError(f"sandbox {sandbox_id} is not answering ({code.name}: {details})")


class _AgentCall:
    """A bidirectional agent call: its requests come from `outbox` until `_END` is put there."""

    def __init__(
        self, call: grpc.aio.StreamStreamCall[Any, Any], outbox: asyncio.Queue[object], sandbox_id: str,
        traced: AgentCallSpan,
    ) -> None:
        self._call = call
        self._outbox = outbox
        self._sandbox_id = sandbox_id
        self._traced = traced

    def cancel(self) -> None:
        self._call.cancel()


class GrpcExecStream(_AgentCall, ExecStream):

    async def events(self) -> AsyncIterator[ExecEvent]:
        try:
            async for event in self._call:
                domain = _exec_event(event, self._traced)
                if domain is not None:
                    yield domain
                    if isinstance(domain, Exited):
                        return
        except grpc.aio.AioRpcError as exc:
            self._traced.finish(error=exc)
            raise map_agent_error(exc, self._sandbox_id) from exc
        finally:
            self._traced.finish()
            self._outbox.put_nowait(_END)
        raise SandboxLostError(f"sandbox {self._sandbox_id} ended the command without an exit status")

    async def write_stdin(self, data: bytes) -> None:
        await self._outbox.put(agent_pb2.ExecRequest(stdin=data))

    async def close_stdin(self) -> None:
        await self._outbox.put(agent_pb2.ExecRequest(close_stdin=agent_pb2.CloseStdin()))

    async def abort(self, reason: str) -> None:
        await self._outbox.put(agent_pb2.ExecRequest(abort=agent_pb2.Abort(reason=reason)))


def _exec_event(event: agent_pb2.ExecEvent, traced: AgentCallSpan) -> ExecEvent | None:
    kind = event.WhichOneof("event")
    if kind == "output":
        stream = event.output.WhichOneof("data") or "stdout"
        return Output(stream, getattr(event.output, stream))
    if kind == "started":
        return Started(event.started.pid)
    if kind == "exited":
        e = event.exited
        traced.finish(event.spans)
        return Exited(e.exit_code, e.signal, e.timed_out, e.aborted, e.duration_ms, e.abort_reason)
    return None


class _SharedCall:
    """One call on a `_SharedStream`: its events in order until its last, with the errors its own RPC would give."""

    _what, _end = "call", "an end"
    """How the lost-sandbox error names the call and what it lacked."""

    def __init__(self, stream: _SharedStream, request: Any, sandbox_id: str, traced: AgentCallSpan) -> None:
        self._stream = stream
        self._number, self._inbox = stream.start(request, traced)
        self._sandbox_id = sandbox_id
        self._traced = traced

    def _domain(self, event: Any) -> Any:
        """The domain form of one of the call's events, or None to skip it."""
        raise NotImplementedError

    def _is_last(self, domain: Any) -> bool:
        raise NotImplementedError

    def _refused(self, item: Any) -> ControlPlaneError:
        raise NotImplementedError

    async def _events(self) -> AsyncIterator[Any]:
        finished = False
        try:
            while True:
                item = await self._inbox.get()
                if isinstance(item, grpc.aio.AioRpcError):
                    self._traced.finish(error=item)
                    raise map_agent_error(item, self._sandbox_id) from item
                if item is None or item.error:
                    finished = True  # the agent's side of the call is over: nothing to cancel
                    if item is not None:
                        raise self._refused(item)
                    break
                domain = self._domain(item.event) if item.HasField("event") else None
                if domain is not None:
                    if self._is_last(domain):
                        # Settled before the yield: a consumer that stops at the last event leaves this
                        # generator to be closed later, and that must not cancel a call that is over.
                        finished = True
                        yield domain
                        return
                    yield domain
                if item.done:
                    finished = True
                    break
        finally:
            self._traced.finish()
            self._stream.forget(self._number, cancel=not finished)
        raise SandboxLostError(f"sandbox {self._sandbox_id} ended the {self._what} without {self._end}")

    def cancel(self) -> None:
        self._stream.forget(self._number, cancel=True)


class StreamedExec(_SharedCall, ExecStream):
    """A command on the agent's ExecMany stream: the same events and errors as over its own Exec."""

    _what, _end = "command", "an exit status"

    def _domain(self, event: agent_pb2.ExecEvent) -> ExecEvent | None:
        return _exec_event(event, self._traced)

    def _is_last(self, domain: ExecEvent) -> bool:
        return isinstance(domain, Exited)

    def _refused(self, item: agent_pb2.ExecManyEvent) -> ControlPlaneError:
        return _refusal(item.code, item.error, self._sandbox_id)

    def events(self) -> AsyncIterator[ExecEvent]:
        return self._events()

    async def write_stdin(self, data: bytes) -> None:
        self._stream.send(self._number, agent_pb2.ExecRequest(stdin=data))

    async def close_stdin(self) -> None:
        self._stream.send(self._number, agent_pb2.ExecRequest(close_stdin=agent_pb2.CloseStdin()))

    async def abort(self, reason: str) -> None:
        self._stream.send(self._number, agent_pb2.ExecRequest(abort=agent_pb2.Abort(reason=reason)))


def _refusal(code: str, message: str, sandbox_id: str) -> ControlPlaneError:
    """What a call refused on a shared stream raises: the error its own RPC's status would have mapped to."""
    status = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    return _status_error(status, message, sandbox_id)


class ReportsAllowed:
    """A tool call whose agent may settle rule-allowed asks itself and report them with its events."""

    _allowed: list[agent_pb2.AllowedAsk] | None = None

    def take_allowed(self) -> list[agent_pb2.AllowedAsk]:
        """The asks the agent allowed by the call's rules since the last look."""
        allowed, self._allowed = self._allowed or [], None
        return allowed

    def _domain_event(self, event: agent_pb2.RunToolEvent, traced: AgentCallSpan) -> RunEvent | None:
        """The domain form of one agent event (None for a kind this side does not know)."""
        if event.allowed:
            self._allowed = (self._allowed or []) + list(event.allowed)
        kind = event.WhichOneof("event")
        if kind == "ask":
            a = event.ask
            return RunAsk(a.ask_id, a.permission, list(a.patterns), list(a.always), _json(a.metadata_json),
                          list(a.checks), a.opaque)
        if kind == "metadata":
            m = event.metadata
            return RunMetadata(m.title if m.has_title else None, _json(m.metadata_json) if m.metadata_json else None)
        if kind == "result":
            r = event.result
            traced.finish(event.spans)
            attachments = [(x.mime, x.url, x.filename) for x in r.attachments]
            spooled = None
            if r.HasField("spooled"):
                s = r.spooled
                spooled = Spooled(s.path, s.total_bytes, s.total_lines, s.tail, s.error, s.capped)
            return RunResult(r.title, r.output, _json(r.metadata_json), attachments, spooled)
        if kind == "failed":
            traced.finish(event.spans)
            return RunFailed(event.failed.message)
        return None


class GrpcBuiltinRun(_AgentCall, ReportsAllowed, BuiltinRun):

    async def events(self) -> AsyncIterator[RunEvent]:
        try:
            async for event in self._call:
                domain = self._domain_event(event, self._traced)
                if domain is not None:
                    yield domain
                    if isinstance(domain, RunResult | RunFailed):
                        return
        except grpc.aio.AioRpcError as exc:
            self._traced.finish(error=exc)
            raise map_agent_error(exc, self._sandbox_id) from exc
        finally:
            self._traced.finish()
            self._outbox.put_nowait(_END)
        raise SandboxLostError(f"sandbox {self._sandbox_id} ended the tool call without a result")

    async def answer(self, ask_id: int, allowed: bool, message: str = "") -> None:
        reply = agent_pb2.AskReply(ask_id=ask_id, allowed=allowed, message=message)
        await self._outbox.put(agent_pb2.RunToolRequest(ask_reply=reply))

    async def abort(self, reason: str) -> None:
        await self._outbox.put(agent_pb2.RunToolRequest(abort=agent_pb2.Abort(reason=reason)))


class _SharedStream:
    """One long-lived agent call (RunTools, ExecMany) carrying many numbered calls, each with its own inbox.

    Its requests and events have the same shape on both RPCs: `call`, `request`, `cancel`, `trace` up;
    `call`, `event`, `done`, `error` down.
    """

    def __init__(self, call: grpc.aio.StreamStreamCall[Any, Any], outbox: asyncio.Queue[object],
                 request_type: type[Any]) -> None:
        self._outbox = outbox
        self._request_type = request_type
        self._inboxes: dict[int, asyncio.Queue[Any]] = {}
        self._numbers = itertools.count(1)
        self._call = call
        self._reader = asyncio.ensure_future(self._read())
        self.open = True

    @classmethod
    def of(cls, rpc: Callable[[AsyncIterator[Any]], grpc.aio.StreamStreamCall[Any, Any]],
           request_type: type[Any]) -> _SharedStream:
        outbox: asyncio.Queue[object] = asyncio.Queue()
        return cls(rpc(_drain(outbox, request_type)), outbox, request_type)

    def start(self, request: Any, traced: AgentCallSpan) -> tuple[int, asyncio.Queue[Any]]:
        """A new call: its number and the inbox its events (then None or the stream's error) arrive in."""
        number = next(self._numbers)
        inbox = self._inboxes[number] = asyncio.Queue()
        self._outbox.put_nowait(self._request_type(call=number, request=request, trace=dict(traced.metadata)))
        return number, inbox

    def send(self, number: int, request: Any) -> None:
        if number in self._inboxes:
            self._outbox.put_nowait(self._request_type(call=number, request=request))

    def forget(self, number: int, *, cancel: bool) -> None:
        if self._inboxes.pop(number, None) is not None and cancel and self.open:
            self._outbox.put_nowait(self._request_type(call=number, cancel=True))

    async def _read(self) -> None:
        ended: grpc.aio.AioRpcError | None = None
        try:
            async for event in self._call:
                inbox = self._inboxes.get(event.call)
                if inbox is not None:
                    inbox.put_nowait(event)
        except grpc.aio.AioRpcError as exc:
            ended = exc
        finally:
            self.close()
            inboxes, self._inboxes = self._inboxes, {}
            for inbox in inboxes.values():
                inbox.put_nowait(ended)

    def close(self) -> None:
        if self.open:
            self.open = False
            self._outbox.put_nowait(_END)
            self._call.cancel()


class StreamedBuiltinRun(_SharedCall, ReportsAllowed, BuiltinRun):
    """A tool call on the agent's RunTools stream: the same events and errors as over its own RunTool."""

    _what, _end = "tool call", "a result"

    def _domain(self, event: agent_pb2.RunToolEvent) -> RunEvent | None:
        return self._domain_event(event, self._traced)

    def _is_last(self, domain: RunEvent) -> bool:
        return isinstance(domain, RunResult | RunFailed)

    def _refused(self, item: agent_pb2.RunToolsEvent) -> ControlPlaneError:
        return InvalidArgumentError(item.error)

    def events(self) -> AsyncIterator[RunEvent]:
        return self._events()

    async def answer(self, ask_id: int, allowed: bool, message: str = "") -> None:
        reply = agent_pb2.AskReply(ask_id=ask_id, allowed=allowed, message=message)
        self._stream.send(self._number, agent_pb2.RunToolRequest(ask_reply=reply))

    async def abort(self, reason: str) -> None:
        self._stream.send(self._number, agent_pb2.RunToolRequest(abort=agent_pb2.Abort(reason=reason)))


def _json(text: str) -> dict[str, object]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


async def _drain(outbox: asyncio.Queue[object], kind: type[Any]) -> AsyncIterator[Any]:
    while (item := await outbox.get()) is not _END:
        assert isinstance(item, kind)
        yield item


class GrpcSandboxAgent(SandboxAgent):
    """Talks to one agent over a gRPC channel (a Unix socket on one host)."""

    def __init__(self, target: str, sandbox_id: str) -> None:
        self.target = target
        self.sandbox_id = sandbox_id
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = agent_pb2_grpc.SandboxAgentStub(self._channel)
        self._rules: dict[int, tuple[LocalRules, agent_pb2.PermissionRules]] = {}
        self._features: frozenset[str] = frozenset()
        """What the agent's Health said it offers beyond the base protocol (an older image offers nothing)."""
        self._tool_stream: _SharedStream | None = None
        self._exec_stream: _SharedStream | None = None

    async def health(self, timeout_s: float = 5.0, *, wait_for_ready: bool = True) -> AgentHealth:
        try:
            r = await self._stub.Health(agent_pb2.HealthRequest(), timeout=timeout_s, wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc
        self._features = frozenset(r.features)
        return AgentHealth(
            r.version, r.agent_pid, r.agent_uid, r.tool_uid, r.workspace, r.uptime_ms, r.running, r.tool_home
        )

    async def exec(self, spec: CommandSpec) -> ExecStream:
        start = agent_pb2.ExecRequest(
            start=agent_pb2.ExecStart(
                argv=spec.argv, command=spec.command, env=spec.env, cwd=spec.cwd, timeout_ms=spec.timeout_ms,
                stdin=spec.stdin, kill_grace_ms=spec.kill_grace_ms, merge_stderr=spec.merge_stderr,
                server=spec.server,
            )
        )
        traced = AgentCallSpan("Exec", self.sandbox_id)
        if "exec_many" in self._features:
            if self._exec_stream is None or not self._exec_stream.open:
                self._exec_stream = _SharedStream.of(self._stub.ExecMany, agent_pb2.ExecManyRequest)
            return StreamedExec(self._exec_stream, start, self.sandbox_id, traced)
        outbox: asyncio.Queue[object] = asyncio.Queue()
        outbox.put_nowait(start)
        call = self._stub.Exec(_drain(outbox, agent_pb2.ExecRequest), metadata=traced.metadata)
        return GrpcExecStream(call, outbox, self.sandbox_id, traced)

    async def run_builtin(self, call: BuiltinCall, rules: LocalRules | None = None, *,
                          path_rules: LocalRules | None = None) -> BuiltinRun:
        """`rules`: the agent settles the asks they allow itself (see `GrpcBuiltinRun.take_allowed`) and
        leaves out what their denies cover; `path_rules` (without `rules`): only the latter."""
        outbox: asyncio.Queue[object] = asyncio.Queue()
        start = agent_pb2.ToolStart(
            tool=call.tool, args_json=json.dumps(call.args), session_id=call.session_id,
            message_id=call.message_id, call_id=call.call_id, agent=call.agent,
            extra_json=json.dumps(call.extra), env=call.env, custom=call.custom,
        )
        if rules is not None and (rules.ceiling is None or "rule_ceiling" in self._features):
            start.rules.CopyFrom(self._encoded(rules))
        elif (filtering := path_rules or rules) is not None:
            # An agent without rule_ceiling still leaves out what the rules deny (it never allows with them).
            start.path_rules.CopyFrom(self._encoded(filtering))
        if "run_tools" in self._features:
            # One long-lived stream for every call: a new RPC per call costs more than the call's messages.
            if self._tool_stream is None or not self._tool_stream.open:
                self._tool_stream = _SharedStream.of(self._stub.RunTools, agent_pb2.RunToolsRequest)
            traced = AgentCallSpan("RunTool", self.sandbox_id)
            return StreamedBuiltinRun(self._tool_stream, agent_pb2.RunToolRequest(start=start), self.sandbox_id, traced)
        outbox.put_nowait(agent_pb2.RunToolRequest(start=start))
        traced = AgentCallSpan("RunTool", self.sandbox_id)
        stream = self._stub.RunTool(_drain(outbox, agent_pb2.RunToolRequest), metadata=traced.metadata)
        return GrpcBuiltinRun(stream, outbox, self.sandbox_id, traced)

    def _encoded(self, rules: LocalRules) -> agent_pb2.PermissionRules:
        """Encoded once per rule snapshot (a session's rules rarely change between calls)."""
        cached = self._rules.get(id(rules))
        if cached is not None and cached[0] is rules:
            return cached[1]
        encoded = encode_rules(rules)
        if len(self._rules) >= 16:
            self._rules.clear()
        self._rules[id(rules)] = (rules, encoded)
        return encoded

    async def save_output(self, name: str, content: bytes) -> str:
        try:
            r = await self._stub.SaveToolOutput(agent_pb2.SaveToolOutputRequest(name=name, content=content))
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc
        return str(r.path)

    async def list_custom_tools(self, config_json: str, env: dict[str, str]) -> CustomListing:
        traced = AgentCallSpan("ListCustomTools", self.sandbox_id)
        try:
            r = await self._stub.ListCustomTools(agent_pb2.ListCustomToolsRequest(config_json=config_json, env=env),
                                                 metadata=traced.metadata)
        except grpc.aio.AioRpcError as exc:
            traced.finish(error=exc)
            raise map_agent_error(exc, self.sandbox_id) from exc
        traced.finish(r.spans)
        return CustomListing(
            tools=[
                CustomToolSpec(t.id, t.description, _json(t.parameters_json_schema), t.source, t.origin, t.init_ms)
                for t in r.tools
            ],
            load_errors=[(e.origin, e.message) for e in r.load_errors],
            hooks=list(r.hooks),
            skills=[(s.name, s.description) for s in r.skills],
            skill_dirs=list(r.skill_dirs),
            config_json=r.config_json,
        )

    async def snapshot_code(self, config_json: str, env: dict[str, str]) -> CodeChanges:
        traced = AgentCallSpan("SnapshotCustomCode", self.sandbox_id)
        try:
            r = await self._stub.SnapshotCustomCode(
                agent_pb2.SnapshotCustomCodeRequest(config_json=config_json, env=env), metadata=traced.metadata,
            )
        except grpc.aio.AioRpcError as exc:
            traced.finish(error=exc)
            raise map_agent_error(exc, self.sandbox_id) from exc
        traced.finish([])
        return CodeChanges(list(r.added), list(r.changed), list(r.removed))

    async def run_plugin_hook(
        self, name: str, input_: dict[str, object], output: dict[str, object], timeout_s: float,
    ) -> dict[str, object]:
        request = agent_pb2.RunPluginHookRequest(
            name=name, input_json=json.dumps(input_), output_json=json.dumps(output), timeout_s=timeout_s,
        )
        traced = AgentCallSpan("RunPluginHook", self.sandbox_id)
        try:
            r = await self._stub.RunPluginHook(request, metadata=traced.metadata)
        except grpc.aio.AioRpcError as exc:
            traced.finish(error=exc)
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise ToolError(exc.details() or f"plugin hook {name} failed") from exc
            raise map_agent_error(exc, self.sandbox_id) from exc
        traced.finish(r.spans)
        return _json(r.output_json)

    async def upload(self, archive: bytes, path: str = "") -> UploadSummary:
        async def chunks() -> AsyncIterator[agent_pb2.UploadWorkspaceRequest]:
            yield agent_pb2.UploadWorkspaceRequest(path=path, chunk=archive[:UPLOAD_CHUNK])
            for offset in range(UPLOAD_CHUNK, len(archive), UPLOAD_CHUNK):
                yield agent_pb2.UploadWorkspaceRequest(chunk=archive[offset : offset + UPLOAD_CHUNK])

        try:
            r = await self._stub.UploadWorkspace(chunks())
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc
        return UploadSummary(r.files, r.directories, r.symlinks, r.bytes, list(r.skipped))

    async def download(self, path: str = "") -> AsyncIterator[bytes]:
        try:
            async for piece in self._stub.DownloadWorkspace(agent_pb2.DownloadWorkspaceRequest(path=path)):
                yield piece.chunk
        except grpc.aio.AioRpcError as exc:
            raise map_agent_error(exc, self.sandbox_id) from exc

    async def close(self) -> None:
        for stream in (self._tool_stream, self._exec_stream):
            if stream is not None:
                stream.close()
        with contextlib.suppress(Exception):
            await self._channel.close()
