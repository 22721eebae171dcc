"""RunTool: one built-in tool call, with its permission asks travelling up the stream and back."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opencode_semantics.tools import BY_ID
from sandbox.v1 import agent_pb2
from sandbox_agent import tool_logs, tracing
from sandbox_agent.custom.host import LogFn
from sandbox_agent.custom.manager import CustomTools
from sandbox_agent.custom.skills import SkillScan
from sandbox_agent.custom.snapshot import SnapshotError
from sandbox_agent.errors import AgentError, ExhaustedError
from sandbox_agent.multiplex import is_start, multiplex, routed
from sandbox_agent.permission_rules import LocalRules
from sandbox_agent.saved_outputs import (
    OUTPUT_NAME,
    TOOL_OUTPUT_DIR,
    Budget,
    OutputDir,
    OutputNotSavedError,
    SpooledText,
    new_name,
)
from sandbox_agent.stdin_credit import FEATURES
from sandbox_agent.tools.base import Attachment, SessionState, ToolContext, ToolError, ToolOutput, ToolRun
from sandbox_agent.tools.paths import with_real_spellings
from sandbox_agent.tools.runner import ToolRunner

MAX_METADATA_JSON = 4 * 1024 * 1024
"""A result's metadata larger than this is replaced by a note: with the output's head it must fit one message."""
METADATA_BACKLOG = 16
"""Events waiting for the control plane before a new metadata update replaces the last one still unsent."""
MAX_RESULT_BYTES = 48 * 1024 * 1024
"""A result message larger than this (attachments included) fails the call instead: the channel carries 64 MiB."""


def load_tool(tool_id: str) -> ToolRun:
    tool = BY_ID.get(tool_id)
    if tool is None or tool.runs_in != "sandbox":
        raise ToolError(f"the sandbox has no built-in tool named {tool_id!r}")
    module = importlib.import_module(f"sandbox_agent.tools.{tool.module}")
    run: ToolRun = module.run
    return run


def find_worktree(directory: str) -> str:
    """The nearest directory at or above `directory` holding `.git`; "/" when there is none."""
    current = directory
    while True:
        if os.path.exists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return "/"
        current = parent


@dataclass
class _Outbox:
    queue: asyncio.Queue[agent_pb2.RunToolEvent | None]
    seq: int = 0
    allowed: list[agent_pb2.AllowedAsk] = field(default_factory=list)
    """Asks the call's rules allowed here, not yet reported: they ride on the next event."""

    unsent_metadata: agent_pb2.RunToolEvent | None = None
    """The latest metadata update while it still waits in the queue: a newer one replaces its content, so a tool
    that streams metadata faster than the control plane reads it holds one update here, not thousands."""

    def put(self, **event: Any) -> None:
        self.seq += 1
        if self.allowed:
            event["allowed"], self.allowed = self.allowed, []
        message = agent_pb2.RunToolEvent(seq=self.seq, **event)
        self.unsent_metadata = message if "metadata" in event else None
        self.queue.put_nowait(message)

    def put_metadata(self, metadata: agent_pb2.ToolMetadata) -> None:
        waiting = self.unsent_metadata
        # Only a reader that lags far behind sees updates merged; one that keeps up gets every update.
        if waiting is not None and not self.allowed and self.queue.qsize() >= METADATA_BACKLOG:
            waiting.metadata.CopyFrom(metadata)
            return
        self.put(metadata=metadata)

    def taken(self, event: agent_pb2.RunToolEvent) -> None:
        if event is self.unsent_metadata:
            self.unsent_metadata = None


class ToolCalls:
    """Runs built-in tool calls for the sessions of this sandbox (one, once claimed)."""

    def __init__(self, runner: ToolRunner, workspace: str, tool_home: str, output_budget_bytes: int = 0,
                 code_dir: str = "") -> None:
        self._runner = runner
        self._workspace = workspace
        self._tool_home = tool_home
        self.outputs = OutputDir(runner.io, os.path.join(tool_home, TOOL_OUTPUT_DIR), Budget(output_budget_bytes))
        self._sessions: dict[str, SessionState] = {}
        # Where tool processes run under another identity (a container), the code dir must be private even
        # when the control plane named none: the fallback beside HOME is the sticky /tmp, which the check
        # refuses (a clear SnapshotError rather than code a tool process could shadow).
        self.custom = CustomTools(runner, workspace, tool_home, code_dir=code_dir or None,
                                  private_code_dir=bool(code_dir) or runner.separates_servers)
        self.running = 0
        self._detached: set[asyncio.Task[None]] = set()
        """Calls of a RunTools stream that went away, finishing their abort."""

    def _state(self, session_id: str) -> SessionState:
        return self._sessions.setdefault(session_id, SessionState())

    def changed_by_caller(self, path: str, when: float) -> None:
        """The files API changed `path` (a file, or a directory's contents): every session of this sandbox
        must read it again before a model writes it (tools/base.py FileTimes.changed)."""
        for state in self._sessions.values():
            state.file_times.changed(path, when)

    async def run(
        self, requests: AsyncIterator[agent_pb2.RunToolRequest], trace: tracing.Recorder | None = None,
    ) -> AsyncIterator[agent_pb2.RunToolEvent]:
        first = await anext(aiter(requests), None)
        if first is None or first.WhichOneof("msg") != "start":
            raise AgentError("the first RunTool message must be `start`")
        start = first.start
        outbox = _Outbox(asyncio.Queue())
        pending: dict[int, asyncio.Future[None]] = {}
        abort = asyncio.Event()
        ask_ids = itertools.count(1)
        rules = LocalRules.of(start.rules) if start.HasField("rules") else None
        path_rules = LocalRules.of(start.path_rules) if start.HasField("path_rules") else rules

        async def ask(permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any],
                      checks: Sequence[str] = (), opaque: bool = False) -> None:
            if rules is not None and rules.allows(permission, patterns, checks, opaque):
                outbox.allowed.append(agent_pb2.AllowedAsk(permission=permission, patterns=patterns, checks=checks,
                                                           opaque=opaque))
                return
            ask_id = next(ask_ids)
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending[ask_id] = waiter
            outbox.put(ask=agent_pb2.ToolAsk(
                ask_id=ask_id, permission=permission, patterns=patterns, always=always,
                metadata_json=json.dumps(metadata), checks=checks, opaque=opaque,
            ))
            try:
                await waiter
            finally:
                pending.pop(ask_id, None)

        async def metadata(title: str | None, meta: dict[str, Any] | None) -> None:
            encoded = json.dumps(meta) if meta is not None else ""
            if len(encoded) > MAX_METADATA_JSON:
                encoded = json.dumps({"metadataOmitted": f"the tool's metadata ({len(encoded)} bytes) is larger "
                                                        f"than {MAX_METADATA_JSON} bytes"})
            outbox.put_metadata(agent_pb2.ToolMetadata(
                has_title=title is not None, title=title or "", metadata_json=encoded,
            ))

        async def listen() -> None:
            async for request in requests:
                kind = request.WhichOneof("msg")
                if kind == "ask_reply":
                    waiter = pending.get(request.ask_reply.ask_id)
                    if waiter is not None and not waiter.done():
                        if request.ask_reply.allowed:
                            waiter.set_result(None)
                        else:
                            waiter.set_exception(ToolError(request.ask_reply.message))
                elif kind == "abort":
                    abort.set()
            # The control plane hung up: the call is over for it.
            abort.set()

        async def execute() -> None:
            final: dict[str, Any] = {}
            try:
                with tracing.span(trace, f"sandbox.tool {start.tool}", _span_attributes(start)) as span:
                    final = await attempt()
                    if span is not None:
                        span.set("sandbox.outcome", "error" if "failed" in final else "ok")
                        if "failed" in final:
                            span.fail(final["failed"].message)
            finally:
                if final:
                    outbox.put(**final, spans=self.shown_spans(trace.drain()) if trace is not None else [])
                outbox.queue.put_nowait(None)

        budget = tool_logs.CallLogs()

        def log_line(line: tool_logs.LogLine) -> None:
            if budget.admit(line):
                outbox.put(log=_log_message(line))

        async def attempt() -> dict[str, Any]:
            try:
                return await attempted()
            finally:
                dropped = budget.close()
                if dropped is not None:  # the call's last log line, still before its result
                    outbox.put(log=_log_message(dropped))

        async def attempted() -> dict[str, Any]:
            try:
                run = self._custom_run(start.tool, abort, log_line) if start.custom else load_tool(start.tool)
                directory = self._workspace
                state = self._state(start.session_id)
                if state.worktree is None:
                    state.worktree = await self._runner.io(find_worktree, directory)
                if self.custom.snapshot is not None:
                    state.skills = self.custom.snapshot.skills  # the `skill` tool serves the snapshot's skills
                ctx = ToolContext(
                    session_id=start.session_id, message_id=start.message_id, call_id=start.call_id,
                    agent=start.agent, directory=directory, worktree=state.worktree,
                    ask=ask, metadata=metadata, runner=self._runner, state=state,
                    abort=abort, extra=json.loads(start.extra_json or "{}"), env=dict(start.env),
                    rules=path_rules,
                    outputs=self.outputs,
                )
                output = await run(json.loads(start.args_json or "{}"), ctx)
                return _bounded_result(await self._spooled(output))
            except ToolError as exc:
                return {"failed": agent_pb2.ToolFailed(message=str(exc))}
            except Exception as exc:  # any tool bug is reported as the call's error
                return {"failed": agent_pb2.ToolFailed(message=_describe(exc))}

        self.running += 1
        listener = asyncio.ensure_future(listen())
        worker = asyncio.ensure_future(execute())
        try:
            while (event := await outbox.queue.get()) is not None:
                outbox.taken(event)
                yield event
        finally:
            self.running -= 1
            abort.set()
            listener.cancel()
            if not worker.done():
                # Give the tool a moment to stop what it started (a killed bash group) before dropping it.
                await asyncio.wait([worker], timeout=3.0)
                worker.cancel()

    async def run_many(
        self, requests: AsyncIterator[agent_pb2.RunToolsRequest],
    ) -> AsyncIterator[agent_pb2.RunToolsEvent]:
        """RunTools: each call runs exactly as `run` runs one RunTool; their events share one stream."""
        def wrap(call: int, event: agent_pb2.RunToolEvent | None = None, done: bool = False, error: str = "",
                 code: str = "") -> agent_pb2.RunToolsEvent:
            return agent_pb2.RunToolsEvent(call=call, event=event, done=done, error=error)

        def run_call(call_requests: AsyncIterator[agent_pb2.RunToolRequest],
                     trace: dict[str, str]) -> AsyncIterator[agent_pb2.RunToolEvent]:
            return self.run(call_requests, tracing.recorder_from_metadata(trace.items()))

        async for event in multiplex(routed(requests), is_start, run_call, wrap, self._detached,
                                     cancel_on_hang_up=False, is_final=_is_end,
                                     hello=agent_pb2.RunToolsEvent(features=FEATURES)):
            yield event

    def _custom_run(self, tool_id: str, abort: asyncio.Event, on_log: LogFn) -> ToolRun:
        async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            context = {
                "sessionID": ctx.session_id, "messageID": ctx.message_id, "agent": ctx.agent, "callID": ctx.call_id,
                "directory": ctx.directory, "worktree": ctx.worktree, "extra": ctx.extra,
            }
            async def ask(permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any]) -> None:
                # A path the tool asks about is checked where it really leads too, as the built-ins do.
                await ctx.ask(permission, await with_real_spellings(ctx, permission, list(patterns)), always, metadata)

            result = await self.custom.call(tool_id, args, context, on_metadata=ctx.metadata, on_ask=ask,
                                            abort=abort, on_log=on_log)
            attachments = [
                Attachment(mime=str(a.get("mime", "")), url=str(a.get("url", "")), filename=str(a.get("filename", "")))
                for a in result.attachments
            ]
            return ToolOutput(result.title, result.output, result.metadata, attachments)

        return run

    async def snapshot_code(self, config_json: str, env: dict[str, str]) -> agent_pb2.SnapshotCustomCodeResponse:
        config = _config(config_json)
        worktree = await self._runner.io(find_worktree, self._workspace)
        try:
            changed = await self.custom.take_snapshot(config, env, worktree)
        except SnapshotError as exc:
            raise AgentError(str(exc)) from None
        return agent_pb2.SnapshotCustomCodeResponse(added=changed.added, changed=changed.changed,
                                                    removed=changed.removed)

    async def list_custom(
        self, config_json: str, env: dict[str, str], trace: tracing.Recorder | None = None,
    ) -> agent_pb2.ListCustomToolsResponse:
        config = _config(config_json)
        with tracing.span(trace, "sandbox.list_custom_tools") as span:
            worktree = await self._runner.io(find_worktree, self._workspace)
            # The calls from now on name paths relative to the worktree this listing reports, which the
            # control plane writes the plan agent's plan-file rule against: both must be the same.
            for state in self._sessions.values():
                state.worktree = worktree
            try:
                listing = await self.custom.listing(config, env, worktree)
            except SnapshotError as exc:
                raise AgentError(str(exc)) from None
            # The skills of the session's code snapshot, read when it was taken.
            scan = self.custom.snapshot.skills if self.custom.snapshot is not None else SkillScan()
            if span is not None:
                span.set("sandbox.tools", len(listing.tools))
                span.set("sandbox.load_errors", len(listing.load_errors))
        return agent_pb2.ListCustomToolsResponse(
            tools=[
                agent_pb2.CustomTool(
                    id=t.id, description=t.description, parameters_json_schema=json.dumps(t.parameters),
                    source=t.source, origin=t.origin, init_ms=t.init_ms,
                )
                for t in listing.tools
            ],
            load_errors=[agent_pb2.CustomLoadError(origin=e.origin, message=e.message) for e in listing.load_errors],
            hooks=listing.hooks,
            spans=self.shown_spans(trace.drain()) if trace is not None else [],
            skills=[agent_pb2.SkillInfo(name=s.name, description=s.description, location=s.location)
                    for s in scan.skills],
            skill_dirs=scan.dirs,
            config_json=listing.config_json,
            worktree=worktree,
            logs=[_log_message(line) for line in listing.logs],
        )

    def shown_spans(self, records: list[agent_pb2.SpanRecord]) -> list[agent_pb2.SpanRecord]:
        """Spans with the code snapshot's paths shown as the workspace paths they copy (as load errors are)."""
        code = self.custom.snapshot
        if code is None or not code.root:
            return records
        for record in records:
            record.status_message = code.outside(record.status_message)
            for attribute in record.attributes:
                if attribute.WhichOneof("value") == "string_value":
                    attribute.string_value = code.outside(attribute.string_value)
            for event in record.events:
                for attribute in event.attributes:
                    if attribute.WhichOneof("value") == "string_value":
                        attribute.string_value = code.outside(attribute.string_value)
        return records

    async def save_output(self, name: str, content: bytes) -> str:
        if not OUTPUT_NAME.match(name):
            raise AgentError(f"{name!r} is not a tool output name")
        try:
            return await self.outputs.save(name, content)
        except OutputNotSavedError as exc:
            raise ExhaustedError(str(exc)) from exc

    async def _spooled(self, output: ToolOutput) -> ToolOutput:
        """An output too large to travel whole (a custom tool's, a spooled command's) leaves as its head, with the
        rest saved here; what the model reads is then built by the control plane from the head and the totals."""
        if output.spooled is not None or len(output.output) <= SPOOL_ABOVE_CHARS:
            return output
        text = output.output
        encoded = text.encode("utf-8", "replace")
        name = new_name()
        path, error = "", ""
        try:
            path = await self.outputs.save(name, encoded)
        except OutputNotSavedError as exc:
            error = str(exc)
        spooled = SpooledText(path=path, total_bytes=len(encoded), total_lines=text.count("\n") + 1,
                              tail=text[-SPOOL_TAIL_CHARS:], error=error)
        return ToolOutput(output.title, text[:SPOOL_HEAD_CHARS], output.metadata, output.attachments, spooled)


def _config(config_json: str) -> dict[str, Any]:
    try:
        config = json.loads(config_json) if config_json else {}
    except json.JSONDecodeError as exc:
        raise AgentError(f"the session's opencode.json is not valid JSON: {exc}") from exc
    return config if isinstance(config, dict) else {}


def _is_end(event: agent_pb2.RunToolEvent) -> bool:
    return event.WhichOneof("event") in ("result", "failed")


SPOOL_ABOVE_CHARS = 1 << 20
SPOOL_HEAD_CHARS = 128 * 1024
SPOOL_TAIL_CHARS = 32 * 1024


def _bounded_result(output: ToolOutput) -> dict[str, Any]:
    """The result event, within what one message may carry: oversized metadata becomes a note, and a result still
    too large (attachments) fails the call with a clear message instead of breaking the stream."""
    result = _result(output)
    if len(result.metadata_json) > MAX_METADATA_JSON:
        result.metadata_json = json.dumps({
            "metadataOmitted": f"the tool's metadata ({len(result.metadata_json)} bytes) is larger than "
                               f"{MAX_METADATA_JSON} bytes",
        })
    size = result.ByteSize()
    if size > MAX_RESULT_BYTES:
        return {"failed": agent_pb2.ToolFailed(
            message=f"The tool's result is {size >> 20} MiB, larger than the {MAX_RESULT_BYTES >> 20} MiB a "
                    "result may be; ask for less (a smaller file, a narrower range)")}
    return {"result": result}


def _span_attributes(start: agent_pb2.ToolStart) -> dict[str, tracing.AttributeValue]:
    return {
        "gen_ai.tool.name": start.tool, "gen_ai.tool.call.id": start.call_id, "sandbox.session.id": start.session_id,
        "sandbox.tool.source": "custom" if start.custom else "builtin",
    }


def _result(output: ToolOutput) -> agent_pb2.ToolResult:
    result = agent_pb2.ToolResult(
        title=output.title, output=output.output, metadata_json=json.dumps(output.metadata),
        attachments=[agent_pb2.ToolAttachment(mime=a.mime, url=a.url, filename=a.filename) for a in output.attachments],
    )
    if output.spooled is not None:
        s = output.spooled
        result.spooled.CopyFrom(agent_pb2.SpooledOutput(
            path=s.path, total_bytes=s.total_bytes, total_lines=s.total_lines, tail=s.tail, error=s.error,
            capped=s.capped,
        ))
    return result


def _log_message(line: tool_logs.LogLine) -> agent_pb2.ToolLog:
    return agent_pb2.ToolLog(origin=line.origin, level=line.level, text=line.text, at=line.at)


def _describe(exc: BaseException) -> str:
    """Node-style text for an unexpected failure (what upstream's thrown errors read like)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__
