"""One tool call, the same way wherever the tool runs.

pending -> running -> doom-loop check -> `tool.execute.before` hooks (their returned args are used)
-> validate (upstream's invalid-arguments text) -> execute (asks go through the
permission gate) -> truncation (the full output saved inside the sandbox) -> `tool.execute.after`
hooks (for MCP tools, before truncation) -> completed. Any failure becomes an `error` event; the
caller's stream never breaks.
Every call's outcome is audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.core.calls import arg_worker, arguments, truncation
from controlplane.core.calls.abort import on_abort
from controlplane.core.calls.doom_loop import DoomLoopDetector, fingerprint
from controlplane.core.calls.hooks import HookBus
from controlplane.core.calls.large_arguments import LargeArguments, Prepared
from controlplane.core.calls.subcalls import ExecutorSubCalls
from controlplane.core.calls.tool import (
    InitContext,
    PermissionAsk,
    SandboxCalls,
    ToolContext,
    ToolError,
    ToolInfo,
    ToolResult,
    ToolSource,
)
from controlplane.core.calls.tool_events import (
    CallEvent,
    CallStatus,
    Completed,
    Failed,
    MetadataUpdated,
    StateChanged,
)
from controlplane.core.calls.tool_log import ToolLogged
from controlplane.core.definitions.validation import validate
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import AskScope, CallAsks, PermissionGate
from controlplane.core.permissions.audit import AuditEntry, AuditLog, NoAudit
from controlplane.core.permissions.permission import Rule
from controlplane.core.permissions.questions import QuestionScope
from controlplane.core.sessions.services import SessionServices
from controlplane.core.tenants.quota import TenantQuotas
from controlplane.errors import SandboxLostError
from controlplane.telemetry import spans
from opencode_semantics.javascript import json_stringify

ABORTED = "Tool execution aborted"
ABORT_GRACE_S = 3.0
"""How long an aborted tool may take to report what it did (bash reports the abort in its output)."""


@dataclass(frozen=True)
class CallRequest:
    session_id: str
    tool: str
    args_json: str
    call_id: str
    message_id: str = ""
    nested: bool = False
    """Run on behalf of another call (a `batch` entry), not by the model: no doom-loop watch."""


@dataclass(frozen=True)
class CallScope:
    """What the executor knows of the session a call runs in."""

    session_id: str
    agent: str
    ruleset: list[Rule]
    tools: Mapping[str, ToolInfo]
    """The session's tools by id, in registry order (the `invalid` tool included)."""
    sandbox: SandboxCalls
    tenant: str = ""
    policy: list[Rule] = field(default_factory=list)
    """Operator rules, evaluated after everything else."""
    ceiling: list[Rule] | None = None
    """`ruleset` without the workspace's config layers when that differs: the stricter decides (rule_layers)."""
    directory: str = "/workspace"
    sandbox_hooks: frozenset[str] = frozenset()
    """Hook names the project's plugins define (they run in the sandbox, after the operator's)."""
    sandbox_id: str = ""
    services: SessionServices = field(default_factory=SessionServices)
    """The session's todos, questions and registry view, for control-plane tools."""
    on_sandbox_lost: Callable[[str], Awaitable[None]] | None = None
    """Marks the session failed (given the reason) before the caller hears its sandbox is gone."""


Emit = Callable[[CallEvent], None]


class ToolExecutor:
    def __init__(
        self, gate: PermissionGate, hooks: HookBus, audit: AuditLog | None = None, quotas: TenantQuotas | None = None,
        arg_worker_memory_mb: int = arg_worker.DEFAULT_MEMORY_MB,
    ) -> None:
        self.gate = gate
        self.hooks = hooks
        self.audit = audit or NoAudit()
        self.quotas = quotas
        """The tenants' quotas: a sub-call (a `batch` entry) takes a call slot of its own."""
        self.doom_loop = DoomLoopDetector()
        self._lanes = arguments.TenantLanes()
        self._large = LargeArguments(arg_worker_memory_mb)

    async def execute(self, scope: CallScope, call: CallRequest, emit: Emit, abort: asyncio.Event) -> None:
        outcome, detail = "error", ""
        info = scope.tools.get(call.tool) or scope.tools.get(call.tool.lower())
        source, origin = (info.source.value, info.origin) if info is not None else ("", "")
        try:
            with spans.execute_tool(
                call.tool, call.call_id, scope.session_id, scope.tenant, scope.sandbox_id, source, origin,
            ) as traced:
                outcome, detail = await self._execute(scope, call, emit, abort, traced)
        finally:
            await self.audit.record(AuditEntry(
                tenant=scope.tenant, session_id=scope.session_id, kind="call", tool=call.tool, call_id=call.call_id,
                outcome=outcome, detail=detail,
            ))

    async def _execute(
        self, scope: CallScope, call: CallRequest, emit: Emit, abort: asyncio.Event, traced: spans.CallTrace,
    ) -> tuple[str, str]:
        """Runs the call; returns its audited outcome (ok, error, cancelled, denied) and error text."""
        work = asyncio.ensure_future(self._run(scope, call, emit, abort))
        # Queued before the work's first step runs, so the stream still starts with these two; that step,
        # which hands the call to the sandbox, goes first on the loop, ahead of the stream's writes.
        emit(StateChanged(CallStatus.PENDING))
        emit(StateChanged(CallStatus.RUNNING))
        settled = asyncio.get_running_loop().create_future()

        def settle(*_: object) -> None:
            if not settled.done():
                settled.set_result(None)

        work.add_done_callback(settle)
        stop_watching = on_abort(abort, settle)
        try:
            await settled
            if not work.done():
                self.gate.cancel_call(scope.session_id, call.call_id, ABORTED)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(work), ABORT_GRACE_S)
            if not work.done() or work.cancelled():
                work.cancel()
                raise ToolError(ABORTED)
            error = work.exception()
            if error is not None:
                raise error
            result = work.result()
        except SandboxLostError as exc:
            # The session is failed first, so a caller reacting to the error already sees it FAILED.
            if scope.on_sandbox_lost is not None:
                await scope.on_sandbox_lost(str(exc))
            emit(StateChanged(CallStatus.ERROR))
            emit(Failed(str(exc)))
            traced.failed("error", exc)
            return "error", str(exc)
        except ToolError as exc:
            emit(StateChanged(CallStatus.ERROR))
            emit(Failed(str(exc)))
            traced.failed(_outcome(exc, abort), exc)
            return _outcome(exc, abort), str(exc)
        except Exception as exc:  # a bug in a tool must not break the caller's stream
            emit(StateChanged(CallStatus.ERROR))
            emit(Failed(f"{type(exc).__name__}: {exc}"))
            traced.failed("error", exc)
            return "error", f"{type(exc).__name__}: {exc}"
        finally:
            stop_watching()
            work.remove_done_callback(settle)
            if not work.done():
                work.cancel()
        traced.completed(result.output, result.metadata.get("truncated") is True, aborted=abort.is_set())
        emit(StateChanged(CallStatus.COMPLETED))
        emit(Completed(result))
        return "ok", ""

    async def _shell_env(self, scope: CallScope, call: CallRequest, args: dict[str, Any]) -> dict[str, str]:
        """The `shell.env` hooks' environment for a bash call: the operator's, then the project plugins'."""
        shell_in = {"cwd": args.get("workdir") or scope.directory, "sessionID": scope.session_id,
                    "callID": call.call_id}
        shown: dict[str, Any] = {"env": {}}
        if self.hooks.has("shell.env"):
            shown = await self.hooks.trigger("shell.env", shell_in, shown)
        if "shell.env" in scope.sandbox_hooks:
            shown = await scope.sandbox.plugin_hook("shell.env", shell_in, {"env": shown.get("env") or {}})
        env = shown.get("env") or {}
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    async def _run(self, scope: CallScope, call: CallRequest, emit: Emit, abort: asyncio.Event) -> ToolResult:
        arg_worker.current_tenant.set(scope.tenant)  # this task's own context: the worker's turns are per tenant
        n = arguments.size(call.args_json) if len(call.args_json) >= arguments.OFF_LOOP_BYTES else 0
        prepared: Prepared | None = None
        if n:  # in the worker process when it can (large_arguments), a thread when not; in the tenant's lane
            async with self._lanes.held(scope.tenant):
                prepared = await self._large.prepared(scope, call)
                tool, raw_args = prepared.resolved if prepared is not None else await arguments.handled(
                    n, self._resolve, scope, call)
                text = None
                if not call.nested:
                    text = prepared.text if prepared is not None else await arguments.handled(
                        n, lambda: fingerprint(json_stringify(raw_args)))
        else:
            tool, raw_args = self._resolve(scope, call)
            text = None
        ask_scope = AskScope(
            tenant=scope.tenant, session_id=scope.session_id, call_id=call.call_id, message_id=call.message_id,
            tool=tool.id, ruleset=scope.ruleset, policy=scope.policy, ceiling=scope.ceiling,
        )

        ask = CallAsks(self.gate, ask_scope, emit)
        if not call.nested and self.doom_loop.observe(scope.session_id, call.message_id, tool.id, raw_args, text):
            await ask(PermissionAsk("doom_loop", [tool.id], [tool.id], {"tool": tool.id, "input": raw_args}))
        with spans.call_init(tool.id, tool.source.value, tool.origin, loaded_elsewhere=tool.init_ms is not None):
            definition = await tool.init(InitContext(agent=scope.agent))
        # Upstream validates inside the tool's execute: before-hooks see the model's arguments, and
        # what they leave is what gets validated.
        args = raw_args
        hook_in = {"tool": tool.id, "sessionID": scope.session_id, "callID": call.call_id}
        if self.hooks.has("tool.execute.before") or "tool.execute.before" in scope.sandbox_hooks:
            args = copy.deepcopy(raw_args)
        if self.hooks.has("tool.execute.before"):
            args = (await self.hooks.trigger("tool.execute.before", hook_in, {"args": args})).get("args", args)
        if "tool.execute.before" in scope.sandbox_hooks:
            args = (await scope.sandbox.plugin_hook("tool.execute.before", hook_in, {"args": args})).get("args", args)
        if not isinstance(args, dict):
            raise ToolError(f"A tool.execute.before hook replaced the arguments of {tool.id} with a non-object")
        if definition.parameters is not None:
            if n:
                async with self._lanes.held(scope.tenant):
                    checked = await self._large.validated(tool.id, definition, args, prepared)
                    args = checked if checked is not None else await arguments.handled(
                        n, validate, tool.id, definition.parameters, args, definition.format_validation_error)
            else:
                args = validate(tool.id, definition.parameters, args, definition.format_validation_error)
        prepared = text = None  # the worker's pickles and the doom-loop text: not kept while the tool runs
        env: dict[str, str] = {}
        if tool.id == "bash":
            env = await self._shell_env(scope, call, args)

        async def metadata(title: str | None, meta: dict[str, Any] | None) -> None:
            emit(MetadataUpdated(title, meta))

        execute_span = spans.current()

        def log(line: ToolLogged) -> None:
            line = replace(line, call_id=call.call_id)
            spans.tool_logged(execute_span, line.origin, line.level, line.text, line.at)
            emit(line)

        ctx = ToolContext(
            session_id=scope.session_id, message_id=call.message_id, call_id=call.call_id, agent=scope.agent,
            ask=ask, metadata=metadata, sandbox=scope.sandbox, abort=abort, env=env,
            services=self._call_services(scope, call, raw_args, emit, abort), rules=ask, log=log,
        )
        result = await definition.execute(args, ctx)
        # Upstream truncates inside a tool's own execute, so after-hooks see the truncated output and its
        # `truncated`; an MCP tool's after-hooks come first, on the server's whole result.
        if tool.source is not ToolSource.MCP:
            result = await self._truncated(scope, result)
        result = await self._after_hooks(scope, {**hook_in, "args": args}, result)
        return result if tool.source is not ToolSource.MCP else await self._truncated(scope, result)

    @staticmethod
    async def _truncated(scope: CallScope, result: ToolResult) -> ToolResult:
        if result.spooled is not None:
            # Only the head travelled: it is truncated whatever the tool set (it cannot be shown whole).
            content, extra = truncation.spooled_truncation(
                result.output, result.spooled, task_allowed=truncation.task_hint_allowed(scope.ruleset))
            return replace(result, output=content, metadata={**result.metadata, **extra}, spooled=None)
        if "truncated" in result.metadata:
            return result
        content, extra = await truncation.apply_truncation(
            result.output, save=scope.sandbox.save_output,
            task_allowed=truncation.task_hint_allowed(scope.ruleset)
            and (scope.ceiling is None or truncation.task_hint_allowed(scope.ceiling)),
        )
        return replace(result, output=content, metadata={**result.metadata, **extra})

    def _call_services(
        self, scope: CallScope, call: CallRequest, raw_args: dict[str, Any], emit: Emit, abort: asyncio.Event,
    ) -> SessionServices:
        """The session's services plus what belongs to this call: its arguments, questions and sub-calls."""
        broker = scope.services.questions
        where = QuestionScope(scope.tenant, scope.session_id, call.call_id, call.message_id)

        async def ask_questions(questions: list[dict[str, Any]]) -> list[list[str]]:
            assert broker is not None
            return await broker.ask(where, questions, emit, abort)

        async def run_call(tool: str, args_json: str, call_id: str, sub_emit: Emit) -> None:
            sub = CallRequest(scope.session_id, tool, args_json, call_id, call.message_id, nested=True)
            await self.execute(scope, sub, sub_emit, abort)

        quotas = self.quotas

        async def refused(tool: str, call_id: str, message: str) -> None:
            await self.audit.record(AuditEntry(
                tenant=scope.tenant, session_id=scope.session_id, kind="call", tool=tool, call_id=call_id,
                outcome="denied", rule="quota calls", detail=message,
            ))

        subcalls = ExecutorSubCalls(
            run_call, emit, scope.services.registered,
            (lambda: quotas.take_call(scope.tenant)) if quotas is not None else None, refused,
        )
        return replace(
            scope.services, raw_args=raw_args, ask_questions=ask_questions if broker is not None else None,
            subcalls=subcalls, announce=emit,
        )

    async def _after_hooks(self, scope: CallScope, hook_in: dict[str, Any], result: ToolResult) -> ToolResult:
        """The operator's after-hooks (one that fails is logged and skipped), then the project plugins'
        (one that throws fails the call, as upstream's hook trigger does)."""
        output: dict[str, Any] = {"title": result.title, "output": result.output, "metadata": result.metadata}
        if self.hooks.has("tool.execute.after"):
            output = await self.hooks.trigger("tool.execute.after", hook_in, output, tolerant=True)
        if "tool.execute.after" in scope.sandbox_hooks:
            output = await scope.sandbox.plugin_hook("tool.execute.after", hook_in, output)
        return replace(
            result, title=str(output.get("title", result.title)), output=str(output.get("output", result.output)),
            metadata=dict(output.get("metadata") or {}) if "metadata" in output else result.metadata,
        )

    def _resolve(self, scope: CallScope, call: CallRequest) -> tuple[ToolInfo, dict[str, Any]]:
        """The tool and its arguments, repaired the way upstream repairs a model's bad call."""
        try:
            args = json.loads(call.args_json) if call.args_json.strip() else {}
            problem = "" if isinstance(args, dict) else "the arguments must be a JSON object"
        except json.JSONDecodeError as exc:
            args, problem = {}, f"JSON parse failed: {exc}"
        tool = scope.tools.get(call.tool)
        if tool is None and call.tool.lower() in scope.tools:
            tool = scope.tools[call.tool.lower()]
        if tool is not None and not problem:
            return tool, args
        if tool is None:
            available = ", ".join(t for t in scope.tools if t != "invalid")
            error = f"Model tried to call unavailable tool '{call.tool}'. Available tools: {available}."
        else:
            error = f"Invalid input for tool {call.tool}: {problem}"
        invalid = scope.tools.get("invalid")
        if invalid is None:
            raise ToolError(error)
        return invalid, {"tool": call.tool, "error": error}


def _outcome(error: ToolError, abort: asyncio.Event) -> str:
    if isinstance(error, permission.DeniedError | permission.RejectedError | permission.CorrectedError):
        return "denied"
    return "cancelled" if abort.is_set() else "error"
