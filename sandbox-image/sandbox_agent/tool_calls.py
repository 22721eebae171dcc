"""RunTool: one built-in tool call, with its permission asks travelling up the stream and back."""

from __future__ import annotations

import asyncio
import functools
import importlib
import itertools
import json
import os
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox.v1 import agent_pb2
from sandbox_agent import tracing
from sandbox_agent.custom.manager import CustomTools
from sandbox_agent.errors import AgentError
from sandbox_agent.multiplex import is_start, multiplex, routed
from sandbox_agent.permission_rules import LocalRules
from sandbox_agent.tools.base import Attachment, SessionState, ToolContext, ToolError, ToolOutput, ToolRun
from sandbox_agent.tools.runner import ToolRunner
from sandbox_agent.tools.skill import scan_skills

BUILTIN_TOOLS = {
    "bash": "bash", "read": "read", "write": "write", "edit": "edit", "multiedit": "multiedit",
    "apply_patch": "apply_patch", "glob": "glob", "grep": "grep", "list": "list", "skill": "skill",
    "lsp": "lsp",
}
OUTPUT_NAME = re.compile(r"^tool_[0-9a-f]{12}[0-9A-Za-z]{14}$")
TOOL_OUTPUT_DIR = ".local/share/opencode/tool-output"


def load_tool(tool_id: str) -> ToolRun:
    module_name = BUILTIN_TOOLS.get(tool_id)
    if module_name is None:
        raise ToolError(f"the sandbox has no built-in tool named {tool_id!r}")
    module = importlib.import_module(f"sandbox_agent.tools.{module_name}")
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

    def put(self, **event: Any) -> None:
        self.seq += 1
        if self.allowed:
            event["allowed"], self.allowed = self.allowed, []
        self.queue.put_nowait(agent_pb2.RunToolEvent(seq=self.seq, **event))


class ToolCalls:
    """Runs built-in tool calls for the sessions of this sandbox (one, once claimed)."""

    def __init__(self, runner: ToolRunner, workspace: str, tool_home: str) -> None:
        self._runner = runner
        self._workspace = workspace
        self._tool_home = tool_home
        self._sessions: dict[str, SessionState] = {}
        self.custom = CustomTools(runner, workspace, tool_home)
        self.running = 0
        self._detached: set[asyncio.Task[None]] = set()
        """Calls of a RunTools stream that went away, finishing their abort."""

    def _state(self, session_id: str) -> SessionState:
        return self._sessions.setdefault(session_id, SessionState())

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
        rules = LocalRules(start.rules.rules) if start.HasField("rules") else None

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
            outbox.put(metadata=agent_pb2.ToolMetadata(
                has_title=title is not None, title=title or "",
                metadata_json=json.dumps(meta) if meta is not None else "",
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
                    outbox.put(**final, spans=trace.drain() if trace is not None else [])
                outbox.queue.put_nowait(None)

        async def attempt() -> dict[str, Any]:
            try:
                run = self._custom_run(start.tool, abort) if start.custom else load_tool(start.tool)
                directory = self._workspace
                state = self._state(start.session_id)
                if state.worktree is None:
                    state.worktree = await self._runner.io(find_worktree, directory)
                ctx = ToolContext(
                    session_id=start.session_id, message_id=start.message_id, call_id=start.call_id,
                    agent=start.agent, directory=directory, worktree=state.worktree,
                    ask=ask, metadata=metadata, runner=self._runner, state=state,
                    abort=abort, extra=json.loads(start.extra_json or "{}"), env=dict(start.env),
                )
                output = await run(json.loads(start.args_json or "{}"), ctx)
                return {"result": _result(output)}
            except ToolError as exc:
                return {"failed": agent_pb2.ToolFailed(message=str(exc))}
            except Exception as exc:  # any tool bug is reported as the call's error
                return {"failed": agent_pb2.ToolFailed(message=_describe(exc))}

        self.running += 1
        listener = asyncio.ensure_future(listen())
        worker = asyncio.ensure_future(execute())
        try:
            while (event := await outbox.queue.get()) is not None:
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
                                     cancel_on_hang_up=False, is_final=_is_end):
            yield event

    def _custom_run(self, tool_id: str, abort: asyncio.Event) -> ToolRun:
        async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            context = {
                "sessionID": ctx.session_id, "messageID": ctx.message_id, "agent": ctx.agent, "callID": ctx.call_id,
                "directory": ctx.directory, "worktree": ctx.worktree, "extra": ctx.extra,
            }
            result = await self.custom.call(tool_id, args, context, on_metadata=ctx.metadata, on_ask=ctx.ask,
                                            abort=abort)
            attachments = [
                Attachment(mime=str(a.get("mime", "")), url=str(a.get("url", "")), filename=str(a.get("filename", "")))
                for a in result.attachments
            ]
            return ToolOutput(result.title, result.output, result.metadata, attachments)

        return run

    async def list_custom(
        self, config_json: str, env: dict[str, str], trace: tracing.Recorder | None = None,
    ) -> agent_pb2.ListCustomToolsResponse:
        try:
            config = json.loads(config_json) if config_json else {}
        except json.JSONDecodeError as exc:
            raise AgentError(f"the session's opencode.json is not valid JSON: {exc}") from exc
        with tracing.span(trace, "sandbox.list_custom_tools") as span:
            worktree = await self._runner.io(find_worktree, self._workspace)
            listing = await self.custom.listing(config if isinstance(config, dict) else {}, env, worktree)
            scan = await self._runner.io(functools.partial(
                scan_skills, self._workspace, worktree, env=env, config=config if isinstance(config, dict) else {},
            ))
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
            spans=trace.drain() if trace is not None else [],
            skills=[agent_pb2.SkillInfo(name=s.name, description=s.description, location=s.location)
                    for s in scan.skills],
            skill_dirs=scan.dirs,
            config_json=listing.config_json,
        )

    async def save_output(self, name: str, content: bytes) -> str:
        if not OUTPUT_NAME.match(name):
            raise AgentError(f"{name!r} is not a tool output name")
        directory = os.path.join(self._tool_home, TOOL_OUTPUT_DIR)
        path = os.path.join(directory, name)
        await self._runner.io(_write_new, directory, path, content)
        return path


def _is_end(event: agent_pb2.RunToolEvent) -> bool:
    return event.WhichOneof("event") in ("result", "failed")


def _write_new(directory: str, path: str, content: bytes) -> None:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(content)


def _span_attributes(start: agent_pb2.ToolStart) -> dict[str, tracing.AttributeValue]:
    return {
        "gen_ai.tool.name": start.tool, "gen_ai.tool.call.id": start.call_id, "sandbox.session.id": start.session_id,
        "sandbox.tool.source": "custom" if start.custom else "builtin",
    }


def _result(output: ToolOutput) -> agent_pb2.ToolResult:
    return agent_pb2.ToolResult(
        title=output.title, output=output.output, metadata_json=json.dumps(output.metadata),
        attachments=[agent_pb2.ToolAttachment(mime=a.mime, url=a.url, filename=a.filename) for a in output.attachments],
    )


def _describe(exc: BaseException) -> str:
    """Node-style text for an unexpected failure (what upstream's thrown errors read like)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__
