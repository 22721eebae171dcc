"""The SandboxAgent service: the agent's RPC handlers (served as frames and, where needed, gRPC: serving.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Any

from sandbox.v1 import agent_pb2
from sandbox_agent import __version__, tool_home, tracing
from sandbox_agent.config import AgentConfig
from sandbox_agent.egress_forwarder import SOCKET_NAME as EGRESS_SOCKET
from sandbox_agent.egress_forwarder import EgressForwarder, NetworkStartError, proxy_env, write_ca_bundle
from sandbox_agent.errors import AgentError, ExhaustedError, SpawnError, WorkspacePathError
from sandbox_agent.file_rpcs import FileRpcs
from sandbox_agent.helper_temps import Announced, collect, stop_and_clean
from sandbox_agent.multiplex import call_aside, is_start, multiplex, routed
from sandbox_agent.process import Chunk, ExecSpec, Execution, Exit, Identity
from sandbox_agent.rpc_status import Code, RequestsLostError
from sandbox_agent.saved_outputs import resource_error
from sandbox_agent.server_identity import is_bun_server, start_bun_server
from sandbox_agent.stdin_credit import FEATURES, feed
from sandbox_agent.tool_calls import ToolCalls
from sandbox_agent.tools.base import ToolError
from sandbox_agent.tools.runner import ToolRunner
from sandbox_agent.workspace import resolve_cwd, resolve_inside

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELPER_GRACE_S = 5.0
"""SIGTERM to SIGKILL for the agent's own helpers, which are quick to clean up but may be starved of CPU."""


class SandboxAgentService:
    def __init__(self, config: AgentConfig) -> None:
        self._config = config
        use_uid = config.tool_uid >= 0
        self._identity = Identity(uid=config.tool_uid if use_uid else None, gid=config.tool_uid if use_uid else None)
        self._started = time.monotonic()
        self._running: set[Execution] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._network_env: dict[str, str] = {}
        """The proxy's variables once StartNetwork ran (none without a network policy)."""
        self._forwarder: EgressForwarder | None = None
        # The runner keeps this very dict: StartNetwork adds to it, so tool hosts and servers started later get it.
        self._tool_env = self.base_env()
        self._runner = ToolRunner(self._identity, self._tool_env, config.output_buffer_bytes)
        self._tools = ToolCalls(self._runner, config.workspace, config.tool_home, config.output_budget_bytes,
                                config.code_dir)
        self._files = FileRpcs(config.workspace, config.max_upload_bytes, self._start_helper,
                               self._tools.changed_by_caller, self._running, self._spawn_background)

    # -- helpers --------------------------------------------------------------------------------

    def base_env(self) -> dict[str, str]:
        """The clean environment of every tool process: nothing of the agent's own leaks in."""
        return {
            "PATH": DEFAULT_PATH,
            "HOME": self._config.tool_home,
            "LANG": "C.UTF-8",
            "USER": "tool",
            "TMPDIR": "/tmp",
            "TERM": "dumb",
            # A login environment has it; without it bash looks the user up in the password database.
            "SHELL": "/bin/bash",
            # Upstream's process sets these for itself, and every command, server and plugin it starts inherits
            # them (scripts look for them to know an agent runs them); the agent stands in for its process.
            "OPENCODE": "1",
            "AGENT": "1",
            "OPENCODE_PID": str(os.getpid()),
        } | self._network_env

    def _spawn_background(self, work: Coroutine[Any, Any, Any] | asyncio.Task[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run_tool(self, argv: list[str], *, stdin: bool = False, env: dict[str, str] | None = None,
                       kill_grace_s: float | None = None, cwd: str = "") -> Execution:
        """Starts a process of the agent's own as the tool user, in the workspace (or `cwd`)."""
        grace = self._config.kill_grace_ms / 1000 if kill_grace_s is None else kill_grace_s
        spec = ExecSpec(
            argv=argv, env=self.base_env() | (env or {}), cwd=cwd or self._config.workspace, timeout_s=None,
            stdin=stdin, kill_grace_s=grace, merge_stderr=False,
        )
        return await Execution.start(spec, self._identity, self._config.output_buffer_bytes)

    async def run_helper(self, argv: list[str], stdin: bool = False) -> Execution:
        """Starts an agent helper module (python -m sandbox_agent.x) as the tool user."""
        env = {"PYTHONPATH": _AGENT_ROOT, "PYTHONDONTWRITEBYTECODE": "1"}
        # A helper cleans up on SIGTERM (an upload removes its half-written member): a command's 200 ms grace
        # is too short for that on a busy machine, and the SIGKILL after it would leave the temporary file.
        # In `/`: a workspace the model closed (`chmod 000 /workspace`) must still be copied (tario widens it).
        return await self.run_tool([sys.executable, "-m", *argv], stdin=stdin, env=env, kill_grace_s=HELPER_GRACE_S,
                                   cwd="/")

    async def _start_helper(self, argv: list[str], stdin: bool) -> Execution:
        return await self.run_helper(argv, stdin=stdin)

    async def stop_all(self) -> None:
        """Ends the commands and tool hosts while the server still delivers their last events."""
        if self._forwarder is not None:
            await self._forwarder.close()
        await self._tools.custom.close()
        await asyncio.gather(*(e.stop(reason="agent shutting down") for e in list(self._running)))
        await Execution.close_spawners()

    def close(self) -> None:
        """Once the server has stopped: tool calls it cut off may have been using the io threads until then."""
        self._runner.close()

    # -- RPCs -----------------------------------------------------------------------------------

    async def Health(self, request: agent_pb2.HealthRequest, context: Any) -> agent_pb2.HealthResponse:
        return agent_pb2.HealthResponse(
            version=__version__,
            agent_pid=os.getpid(),
            agent_uid=os.getuid(),
            tool_uid=self._identity.uid if self._identity.uid is not None else os.getuid(),
            workspace=self._config.workspace,
            uptime_ms=int((time.monotonic() - self._started) * 1000),
            running=len(self._running) + self._tools.running,
            tool_home=self._config.tool_home,
            flow_control=FEATURES,
        )

    def _spec_from(self, start: agent_pb2.ExecStart) -> ExecSpec:
        if start.argv and start.command:
            raise SpawnError("set either argv or command, not both")
        argv = list(start.argv) if start.argv else ["/bin/bash", "-c", start.command] if start.command else []
        grace = (start.kill_grace_ms or self._config.kill_grace_ms) / 1000
        return ExecSpec(
            argv=argv,
            env=self.base_env() | dict(start.env),
            cwd=resolve_cwd(self._config.workspace, start.cwd),
            timeout_s=start.timeout_ms / 1000 if start.timeout_ms else None,
            stdin=start.stdin,
            kill_grace_s=grace,
            merge_stderr=start.merge_stderr,
        )

    async def ExecMany(
        self, request_iterator: AsyncIterator[agent_pb2.ExecManyRequest], context: Any
    ) -> AsyncIterator[agent_pb2.ExecManyEvent]:
        def run_call(requests: AsyncIterator[agent_pb2.ExecRequest],
                     trace: dict[str, str]) -> AsyncIterator[agent_pb2.ExecEvent]:
            return self._exec(requests, trace.items())

        async for event in multiplex(routed(request_iterator), is_start, run_call, _exec_many_event,
                                     self._background, cancel_on_hang_up=True, is_final=_is_exit,
                                     hello=agent_pb2.ExecManyEvent(features=FEATURES)):
            yield event

    async def _exec(
        self, requests: AsyncIterator[agent_pb2.ExecRequest], trace_metadata: Iterable[tuple[str, Any]],
    ) -> AsyncIterator[agent_pb2.ExecEvent]:
        """One command's events, from `started` to `exited`; an AgentError refuses the call before it starts."""
        first = await anext(aiter(requests), None)
        if first is None or first.WhichOneof("msg") != "start":
            raise AgentError("the first Exec message must be `start`")
        trace = tracing.recorder_from_metadata(trace_metadata)
        span = trace.start("sandbox.exec") if trace is not None else None
        spec = self._spec_from(first.start)
        try:
            if first.start.server and is_bun_server(spec.argv) and self._identity.uid is not None:
                execution = await start_bun_server(spec, self._identity, self._config.output_buffer_bytes)
            else:
                execution = await Execution.start(spec, self._identity, self._config.output_buffer_bytes)
        except OSError as exc:
            if resource_error(exc):  # no pipe or process to be had: this command fails, the sandbox is fine
                raise ExhaustedError(f"cannot start the command: {exc.strerror}") from exc
            raise
        if span is not None:
            span.set("process.pid", execution.pid)
        self._running.add(execution)
        aside = call_aside.get(None)
        credit = (lambda size: aside(stdin_credit=size)) if aside is not None else (lambda size: None)
        pump = asyncio.ensure_future(feed(requests, execution, credit))
        seq = 0
        try:
            seq += 1
            yield agent_pb2.ExecEvent(seq=seq, started=agent_pb2.Started(pid=execution.pid))
            async for item in execution.events():
                seq += 1
                event = _event(seq, item)
                if span is not None and trace is not None and isinstance(item, Exit):
                    _end_exec_span(span, item)
                    event.spans.extend(trace.drain())
                yield event
        finally:
            pump.cancel()
            if not execution.finished:
                # The client went away (cancel, deadline, lost channel): that is an abort.
                self._spawn_background(execution.stop(reason="client cancelled"))
            self._running.discard(execution)

    async def RunTools(
        self, request_iterator: AsyncIterator[agent_pb2.RunToolsRequest], context: Any
    ) -> AsyncIterator[agent_pb2.RunToolsEvent]:
        async for event in self._tools.run_many(request_iterator):
            yield event

    async def ListCustomTools(
        self, request: agent_pb2.ListCustomToolsRequest, context: Any
    ) -> agent_pb2.ListCustomToolsResponse:
        try:
            trace = tracing.recorder_from_metadata(context.invocation_metadata())
            return await self._tools.list_custom(request.config_json, dict(request.env), trace)
        except AgentError as exc:
            await context.abort(Code.INVALID_ARGUMENT, str(exc))
            raise

    async def SnapshotCustomCode(
        self, request: agent_pb2.SnapshotCustomCodeRequest, context: Any
    ) -> agent_pb2.SnapshotCustomCodeResponse:
        try:
            return await self._tools.snapshot_code(request.config_json, dict(request.env))
        except AgentError as exc:
            await context.abort(Code.FAILED_PRECONDITION, str(exc))
            raise

    async def RunPluginHook(
        self, request: agent_pb2.RunPluginHookRequest, context: Any
    ) -> agent_pb2.RunPluginHookResponse:
        trace = tracing.recorder_from_metadata(context.invocation_metadata())
        try:
            with tracing.span(trace, f"sandbox.plugin_hook {request.name}", {"sandbox.hook.name": request.name}):
                output = await self._tools.custom.hook(
                    request.name, json.loads(request.input_json or "{}"), json.loads(request.output_json or "{}"),
                    request.timeout_s,
                )
        except (ToolError, ValueError) as exc:
            await context.abort(Code.FAILED_PRECONDITION, str(exc))
            raise
        spans = self._tools.shown_spans(trace.drain()) if trace is not None else []
        return agent_pb2.RunPluginHookResponse(output_json=json.dumps(output), spans=spans)

    async def SaveToolOutput(
        self, request: agent_pb2.SaveToolOutputRequest, context: Any
    ) -> agent_pb2.SaveToolOutputResponse:
        try:
            path = await self._tools.save_output(request.name, request.content)
        except AgentError as exc:
            await context.abort(Code[exc.status], str(exc))
            raise
        return agent_pb2.SaveToolOutputResponse(path=path)

    async def UploadWorkspace(
        self, request_iterator: AsyncIterator[agent_pb2.UploadWorkspaceRequest], context: Any
    ) -> agent_pb2.UploadWorkspaceResponse:
        iterator = aiter(request_iterator)
        first = await anext(iterator, None)
        try:
            dest = resolve_inside(self._config.workspace, first.path if first else "")
        except WorkspacePathError as exc:
            await _drain(iterator)
            await context.abort(Code.INVALID_ARGUMENT, str(exc))
            raise
        except OSError as exc:
            # realpath raced a tool process swapping a link and a directory on the way (readlink: EINVAL).
            await _drain(iterator)
            await context.abort(Code.INVALID_ARGUMENT,
                                f"{first.path if first else ''!r} changed while it was resolved: {exc.strerror}")
            raise
        confine = [self._config.workspace] if first is not None and first.confine_links else []
        helper = await self.run_helper(
            ["sandbox_agent.tario", "extract", dest, str(self._config.max_upload_bytes), *confine], stdin=True
        )
        self._running.add(helper)
        announced = Announced(self._config.workspace)
        collected = False
        try:
            feed = asyncio.ensure_future(_feed(helper, first, iterator))
            stdout, stderr, exit_ = await collect(helper, announced)
            await feed
            collected = True
        finally:
            self._running.discard(helper)
            if not collected:
                # The caller went away: the helper is stopped, and a member it could not remove is removed for it.
                self._spawn_background(stop_and_clean(helper, announced, "upload cancelled", self._start_helper))
        if exit_.exit_code != 0:
            await announced.remove_left(self._start_helper)
            message = stderr.decode(errors="replace").strip() or f"extraction failed ({exit_.exit_code})"
            code = Code.RESOURCE_EXHAUSTED if exit_.exit_code == 3 else Code.INVALID_ARGUMENT
            await context.abort(code, f"workspace upload refused: {message}")
        summary = json.loads(stdout)
        self._files.caller_changed_under(dest)
        return agent_pb2.UploadWorkspaceResponse(**summary)

    async def DownloadWorkspace(
        self, request: agent_pb2.DownloadWorkspaceRequest, context: Any
    ) -> AsyncIterator[agent_pb2.DownloadWorkspaceResponse]:
        if request.paths:
            async for piece in self._files.pack(list(request.paths), context):
                yield piece
            return
        try:
            src = resolve_inside(self._config.workspace, request.path)
        except WorkspacePathError as exc:
            await context.abort(Code.INVALID_ARGUMENT, str(exc))
            return
        if not os.path.lexists(src):  # noqa: ASYNC240 - one lstat on a local filesystem
            await context.abort(Code.NOT_FOUND, f"{request.path!r} does not exist in the workspace")
            return
        helper = await self.run_helper(["sandbox_agent.tario", "create", src])
        self._running.add(helper)
        errors = bytearray()
        try:
            async for item in helper.events():
                if isinstance(item, Chunk) and item.stream == "stdout":
                    yield agent_pb2.DownloadWorkspaceResponse(chunk=item.data)
                elif isinstance(item, Chunk):
                    errors += item.data
                elif item.exit_code != 0:
                    await context.abort(Code.INTERNAL, errors.decode(errors="replace").strip())
                elif errors:  # the entries the tool user cannot read, left out of an otherwise whole copy
                    logging.getLogger(__name__).warning("workspace copy: %s", errors.decode(errors="replace").strip())
        finally:
            self._running.discard(helper)
            if not helper.finished:
                self._spawn_background(helper.stop(reason="download cancelled"))

    async def WriteFile(
        self, request_iterator: AsyncIterator[agent_pb2.WriteFileRequest], context: Any
    ) -> agent_pb2.FileEntry:
        return await self._files.write(request_iterator, context)

    async def ReadFile(
        self, request: agent_pb2.ReadFileRequest, context: Any
    ) -> AsyncIterator[agent_pb2.ReadFileResponse]:
        async for piece in self._files.read(request, context):
            yield piece

    async def ListFiles(self, request: agent_pb2.ListFilesRequest, context: Any) -> agent_pb2.ListFilesResponse:
        return await self._files.listing(request, context)

    async def StartNetwork(
        self, request: agent_pb2.StartNetworkRequest, context: Any
    ) -> agent_pb2.StartNetworkResponse:
        forwarder = self._forwarder or EgressForwarder(
            os.path.join(os.path.dirname(self._config.socket_path), EGRESS_SOCKET))
        try:
            # Again (a restarted plane adopting the session): the forwarder stays, the CA bundle is renewed.
            port = forwarder.port if self._forwarder is not None else await forwarder.start(request.port)
            bundle = await asyncio.to_thread(write_ca_bundle, request.ca_pem) if request.ca_pem else None
        except (NetworkStartError, OSError) as exc:
            if forwarder is not self._forwarder:
                await forwarder.close()
            await context.abort(Code.FAILED_PRECONDITION, f"cannot start the session's network: {exc}")
            raise
        self._forwarder = forwarder
        env = proxy_env(port, bundle or self._network_env.get("SSL_CERT_FILE"))
        self._network_env.update(env)
        self._tool_env.update(env)
        return agent_pb2.StartNetworkResponse(port=port, env=env)


def _is_exit(event: agent_pb2.ExecEvent) -> bool:
    return event.WhichOneof("event") == "exited"


def _exec_many_event(call: int, event: agent_pb2.ExecEvent | None = None, done: bool = False, error: str = "",
                     code: str = "", stdin_credit: int = 0) -> agent_pb2.ExecManyEvent:
    return agent_pb2.ExecManyEvent(call=call, event=event, done=done, error=error, code=code,
                                   stdin_credit=stdin_credit)


async def _feed(
    helper: Execution, first: agent_pb2.UploadWorkspaceRequest | None,
    rest: AsyncIterator[agent_pb2.UploadWorkspaceRequest],
) -> None:
    if first is not None and first.chunk:
        await helper.write_stdin(first.chunk)
    async for request in rest:
        if request.chunk:
            await helper.write_stdin(request.chunk)
    helper.close_stdin()


async def _drain(rest: AsyncIterator[agent_pb2.UploadWorkspaceRequest]) -> None:
    """Reads a refused upload's stream to its end, as WriteFile does: a caller still writing when the call ends
    would see its own write fail (INTERNAL) instead of the refusal."""
    with contextlib.suppress(RequestsLostError, asyncio.InvalidStateError):
        async for _ in rest:
            pass


def _end_exec_span(span: tracing.Span, item: Exit) -> None:
    span.set("process.exit.code", item.exit_code)
    if item.timed_out or item.aborted or item.signal:
        span.fail(item.abort_reason or ("timed out" if item.timed_out else f"killed by signal {item.signal}"))
    span.end()


def _event(seq: int, item: Chunk | Exit) -> agent_pb2.ExecEvent:
    if isinstance(item, Chunk):
        output = agent_pb2.Output(stdout=item.data) if item.stream == "stdout" else agent_pb2.Output(stderr=item.data)
        return agent_pb2.ExecEvent(seq=seq, output=output)
    return agent_pb2.ExecEvent(
        seq=seq,
        exited=agent_pb2.Exited(
            exit_code=item.exit_code, signal=item.signal, timed_out=item.timed_out, aborted=item.aborted,
            duration_ms=item.duration_ms, abort_reason=item.abort_reason,
        ),
    )


async def prepare_home(service: SandboxAgentService, config: AgentConfig) -> None:
    """Creates the tool user's HOME on the tmpfs, with upstream's state dirs (tool_home.py); done as that user,
    since the agent has no CAP_CHOWN: with that user's filesystem identity on the agent's own thread (no process)."""
    os.makedirs(os.path.dirname(config.tool_home) or "/", exist_ok=True)
    service._runner.io_now(tool_home.make, config.tool_home)
