"""The client of a sandbox agent (sandbox.v1), turned into domain events: over its framed socket where it has one
(agent_framed_calls.py), over gRPC otherwise (Swarm's relay)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc

from controlplane.core.calls.spooled import Spooled
from controlplane.core.calls.tool import ToolError
from controlplane.core.calls.tool_log import ToolLogged
from controlplane.core.permissions.asks import LocalRules
from controlplane.core.seam.messages import (
    AllowedAsk,
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
from controlplane.errors import ControlPlaneError, InvalidArgumentError, SandboxError, SandboxLostError
from controlplane.sandbox.agent_files import AgentFiles
from controlplane.sandbox.agent_framed_calls import NO_STATUS, FramedStub
from controlplane.sandbox.agent_frames import SharedStreams
from controlplane.sandbox.agent_protocol import protocol_error
from controlplane.sandbox.agent_streams import SharedCall, SharedStream, map_agent_error, refusal
from controlplane.sandbox.pinned_socket import PinnedSocket
from controlplane.sandbox.rule_encoding import encode_rules
from controlplane.sandbox.stdin_windows import pieces
from controlplane.telemetry.remote import AgentCallSpan
from sandbox.v1 import agent_pb2, agent_pb2_grpc
from sandbox_agent.frames import frames_path

T = TypeVar("T")

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # A new sandbox's socket appears within milliseconds; the default 1 s backoff would stall us.
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.min_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 200),
]
UPLOAD_CHUNK = 1024 * 1024


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


class StreamedExec(SharedCall, ExecStream):
    """A command on the agent's ExecMany stream."""

    _what, _end = "command", "an exit status"

    def _domain(self, event: agent_pb2.ExecEvent) -> ExecEvent | None:
        return _exec_event(event, self._traced)

    def _is_last(self, domain: ExecEvent) -> bool:
        return isinstance(domain, Exited)

    def _refused(self, item: agent_pb2.ExecManyEvent) -> ControlPlaneError:
        return refusal(item.code, item.error, self._sandbox_id)

    def events(self) -> AsyncIterator[ExecEvent]:
        return self._events()

    async def write_stdin(self, data: bytes) -> None:
        # Waits while the call's stdin window is used up (stdin_windows.py): what a client streams into a command
        # that does not read stays with the client, not in the plane.
        for piece in pieces(data):
            await self._stream.send_stdin(self._number, agent_pb2.ExecRequest(stdin=piece), piece)

    async def close_stdin(self) -> None:
        self._stream.send(self._number, agent_pb2.ExecRequest(close_stdin=agent_pb2.CloseStdin()))

    async def abort(self, reason: str) -> None:
        self._stream.send(self._number, agent_pb2.ExecRequest(abort=agent_pb2.Abort(reason=reason)))


class StreamedBuiltinRun(SharedCall, BuiltinRun):
    """A tool call on the agent's RunTools stream; the asks the agent settled by the call's rules come with
    its events (`take_allowed`)."""

    _what, _end = "tool call", "a result"
    _allowed: list[AllowedAsk] | None = None

    def take_allowed(self) -> list[AllowedAsk]:
        allowed, self._allowed = self._allowed or [], None
        return allowed

    def _domain(self, event: agent_pb2.RunToolEvent) -> RunEvent | None:
        if event.allowed:
            self._allowed = (self._allowed or []) + [
                AllowedAsk(a.permission, list(a.patterns), list(a.checks), a.opaque) for a in event.allowed]
        kind = event.WhichOneof("event")
        if kind == "ask":
            a = event.ask
            return RunAsk(a.ask_id, a.permission, list(a.patterns), list(a.always), _json(a.metadata_json),
                          list(a.checks), a.opaque)
        if kind == "log":
            line = event.log
            return ToolLogged(line.origin, line.level, line.text, line.at)
        if kind == "metadata":
            m = event.metadata
            return RunMetadata(m.title if m.has_title else None, _json(m.metadata_json) if m.metadata_json else None)
        if kind == "result":
            r = event.result
            self._traced.finish(event.spans)
            attachments = [(x.mime, x.url, x.filename) for x in r.attachments]
            spooled = None
            if r.HasField("spooled"):
                s = r.spooled
                spooled = Spooled(s.path, s.total_bytes, s.total_lines, s.tail, s.error, s.capped)
            return RunResult(r.title, r.output, _json(r.metadata_json), attachments, spooled)
        if kind == "failed":
            self._traced.finish(event.spans)
            return RunFailed(event.failed.message)
        return None

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


class GrpcSandboxAgent(AgentFiles, SandboxAgent):
    """Talks to one agent over a gRPC channel (a Unix socket on one host)."""

    def __init__(self, target: str, sandbox_id: str) -> None:
        self.target = target
        self.sandbox_id = sandbox_id
        # A Unix socket is reached through its inode, once it exists (pinned_socket.py: its dir is the sandbox's).
        self._pinned = PinnedSocket(target.removeprefix("unix:")) if target.startswith("unix:") else None
        self._frames = PinnedSocket(frames_path(self._pinned.path)) if self._pinned is not None else None
        self._frames_refused = False
        self._channel: grpc.aio.Channel | None = None
        self._connected: agent_pb2_grpc.SandboxAgentAsyncStub | None = None
        self._rules: dict[int, tuple[LocalRules, agent_pb2.PermissionRules]] = {}
        self._tool_stream: SharedStream | None = None
        self._exec_stream: SharedStream | None = None
        self._streams = SharedStreams(target)

    @property
    def _stub(self) -> agent_pb2_grpc.SandboxAgentAsyncStub:
        if self._connected is None and self._framed_target() is not None:
            # Made before the gRPC socket (if the agent serves gRPC at all): every call goes framed.
            self._connected = cast("agent_pb2_grpc.SandboxAgentAsyncStub", FramedStub(self._framed_target))
        if self._connected is None:
            target = self.target if self._pinned is None else self._pinned.target()
            if target is None:  # not made yet (health() waits for it) or gone with its agent
                raise SandboxLostError(f"sandbox {self.sandbox_id} is not answering (its agent has no socket)")
            self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            self._connected = agent_pb2_grpc.SandboxAgentStub(self._channel)
        return self._connected

    def _framed_only_for_streams(self, exc: grpc.aio.AioRpcError) -> bool:
        """An agent of an image from before every RPC was framed (its frames.sock serves only the shared streams, and
        drops any other call unanswered) that also serves gRPC: a plane upgraded under running sandboxes reaches
        it over gRPC from then on (the shared streams keep their frames)."""
        if not isinstance(self._connected, FramedStub) or self._pinned is None or self._pinned.target() is None:
            return False
        if exc.code() != grpc.StatusCode.UNAVAILABLE or exc.details() != NO_STATUS:
            return False
        self._frames_refused, self._connected = True, None
        return True

    def _framed_target(self) -> str | None:
        """The framed socket's pinned target; None where there is none, or something else stands in its place
        (never followed: such an agent is reached over gRPC, if at all)."""
        if self._frames is None or self._frames_refused:
            return None
        try:
            return self._frames.target()
        except SandboxError:
            return None

    async def health(self, timeout_s: float = 5.0, *, wait_for_ready: bool = True) -> AgentHealth:
        deadline = time.monotonic() + timeout_s
        while self._connected is None and self._pinned is not None and self._pinned.target() is None \
                and self._framed_target() is None:
            if not wait_for_ready or time.monotonic() >= deadline:  # as gRPC's own wait for a socket to appear
                raise SandboxError(f"sandbox {self.sandbox_id}: its agent has no socket after {timeout_s:g} s")
            await asyncio.sleep(0.005)
        timeout_s = max(0.05, deadline - time.monotonic())
        try:
            r = await self._stub.Health(agent_pb2.HealthRequest(), timeout=timeout_s, wait_for_ready=wait_for_ready)
        except grpc.aio.AioRpcError as exc:
            if self._framed_only_for_streams(exc):
                return await self.health(max(0.05, deadline - time.monotonic()), wait_for_ready=wait_for_ready)
            raise map_agent_error(exc, self.sandbox_id) from exc
        # Every look at the agent (its start, its adoption, the liveness check) refuses an agent of an older image.
        refused = protocol_error(r.flow_control, self.sandbox_id, "Health")
        if refused is not None:
            raise refused
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
        if self._exec_stream is None or not self._exec_stream.open:
            self._exec_stream = await self._streams.shared(
                "ExecMany", lambda r: self._stub.ExecMany(r), agent_pb2.ExecManyRequest, agent_pb2.ExecManyEvent)
        return StreamedExec(self._exec_stream, start, self.sandbox_id, traced)

    async def run_builtin(self, call: BuiltinCall) -> BuiltinRun:
        start = agent_pb2.ToolStart(
            tool=call.tool, args_json=json.dumps(call.args), session_id=call.session_id,
            message_id=call.message_id, call_id=call.call_id, agent=call.agent,
            extra_json=json.dumps(call.extra), env=call.env, custom=call.custom,
        )
        if call.rules is not None:
            start.rules.CopyFrom(self._encoded(call.rules))
        elif call.path_rules is not None:
            start.path_rules.CopyFrom(self._encoded(call.path_rules))
        traced = AgentCallSpan("RunTool", self.sandbox_id)
        if self._tool_stream is None or not self._tool_stream.open:
            self._tool_stream = await self._streams.shared(
                "RunTools", lambda r: self._stub.RunTools(r), agent_pb2.RunToolsRequest, agent_pb2.RunToolsEvent)
        return StreamedBuiltinRun(self._tool_stream, agent_pb2.RunToolRequest(start=start), self.sandbox_id, traced)

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
        request = agent_pb2.ListCustomToolsRequest(config_json=config_json, env=env)
        r = await self._traced("ListCustomTools", lambda md: self._stub.ListCustomTools(request, metadata=md))
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
            worktree=r.worktree or "/",
            logs=[ToolLogged(x.origin, x.level, x.text, x.at) for x in r.logs],
        )

    async def snapshot_code(self, config_json: str, env: dict[str, str]) -> CodeChanges:
        request = agent_pb2.SnapshotCustomCodeRequest(config_json=config_json, env=env)
        r = await self._traced("SnapshotCustomCode", lambda md: self._stub.SnapshotCustomCode(request, metadata=md))
        return CodeChanges(list(r.added), list(r.changed), list(r.removed))

    async def start_network(self, port: int, ca_pem: bytes) -> dict[str, str]:
        request = agent_pb2.StartNetworkRequest(port=port, ca_pem=ca_pem)
        r = await self._traced("StartNetwork", lambda md: self._stub.StartNetwork(request, metadata=md))
        return dict(r.env)

    async def _traced(self, method: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """One unary agent call under its trace span (the agent's own spans, when it sends them, join it);
        a failure maps to the platform's error for this sandbox."""
        traced = AgentCallSpan(method, self.sandbox_id)
        try:
            r = await call(traced.metadata)
        except grpc.aio.AioRpcError as exc:
            traced.finish(error=exc)
            raise map_agent_error(exc, self.sandbox_id) from exc
        traced.finish(getattr(r, "spans", []))
        return r

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
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
        if self._pinned is not None:
            self._pinned.close()
        if self._frames is not None:
            self._frames.close()
