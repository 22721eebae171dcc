"""Built-in tool calls carried to the session's sandbox agent, with asks answered by the gate."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from controlplane.core.calls.abort import on_abort
from controlplane.core.calls.hooks import DEFAULT_TIMEOUT_S
from controlplane.core.calls.tool import Attachment, PermissionAsk, SandboxCalls, ToolContext, ToolError, ToolResult
from controlplane.core.calls.tool_log import ToolLogged
from controlplane.core.seam.messages import BuiltinCall, RunAsk, RunFailed, RunMetadata, RunResult
from controlplane.core.seam.provider import SandboxAgent

SAVE_MESSAGE_BYTES = 32 * 1024 * 1024
"""The most of a full output the control plane sends to be saved (the agent's channel carries 64 MiB)."""


class AgentToolCalls(SandboxCalls):
    def __init__(self, agent: SandboxAgent, *, extra: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self._agent = agent
        self._extra = extra or {}
        self._env = env or {}

    async def run_builtin(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self._run(tool, args, ctx, custom=False)

    async def run_custom(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self._run(tool, args, ctx, custom=True)

    async def plugin_hook(self, name: str, input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        return await self._agent.run_plugin_hook(name, input_, output, DEFAULT_TIMEOUT_S)

    async def _run(self, tool: str, args: dict[str, Any], ctx: ToolContext, *, custom: bool) -> ToolResult:
        rules = await ctx.rules.local_rules() if ctx.rules is not None else None
        # With asks all going up, the agent still leaves out what a deny covers (grep, glob, list).
        path_rules = await ctx.rules.path_rules() if ctx.rules is not None and rules is None else None
        call = BuiltinCall(
            tool=tool, args=args, session_id=ctx.session_id, message_id=ctx.message_id, call_id=ctx.call_id,
            agent=ctx.agent, extra={**self._extra, **ctx.extra}, env={**self._env, **ctx.env}, custom=custom,
            rules=rules, path_rules=path_rules,
        )
        run = await self._agent.run_builtin(call)

        forwarding: set[asyncio.Task[None]] = set()

        def forward_abort() -> None:
            task = asyncio.ensure_future(run.abort("aborted"))
            forwarding.add(task)
            task.add_done_callback(forwarding.discard)

        stop_watching = on_abort(ctx.abort, forward_abort)
        refused: ToolError | None = None
        outcome: ToolResult | ToolError | None = None
        try:
            # The loop runs on past the last event: the events end right after it, and a generator left
            # suspended would be closed later by a task of its own.
            async for event in run.events():
                if rules is not None and ctx.rules is not None:
                    # Asks the agent allowed itself are audited before whatever came after them.
                    for allowed in run.take_allowed():
                        await ctx.rules.allowed_elsewhere(allowed.permission, allowed.patterns, rules,
                                                          allowed.checks, allowed.opaque)
                if isinstance(event, RunAsk):
                    try:
                        await ctx.ask(PermissionAsk(event.permission, event.patterns, event.always, event.metadata,
                                                    event.checks, event.opaque))
                    except ToolError as exc:
                        refused = exc
                        await run.answer(event.ask_id, False, str(exc))
                    else:
                        await run.answer(event.ask_id, True)
                elif isinstance(event, RunMetadata):
                    await ctx.metadata(event.title, event.metadata)
                elif isinstance(event, ToolLogged):
                    if ctx.log is not None:
                        ctx.log(event)
                elif isinstance(event, RunResult):
                    attachments = [Attachment(mime, url, name) for mime, url, name in event.attachments]
                    outcome = ToolResult(event.title, event.output, dict(event.metadata), attachments, event.spooled)
                elif isinstance(event, RunFailed):
                    # A refusal keeps its type (denied, rejected, corrected) for the audit and the caller.
                    outcome = refused if refused is not None and str(refused) == event.message else ToolError(
                        event.message)
        finally:
            stop_watching()
            for task in list(forwarding):  # an abort being forwarded reaches the agent before any cancel
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if outcome is None:
                run.cancel()
        if isinstance(outcome, ToolError):
            raise outcome
        if outcome is None:
            raise ToolError("the sandbox ended the tool call without a result")
        return outcome

    async def save_output(self, name: str, content: str) -> str:
        encoded = content.encode("utf-8", "replace")
        if len(encoded) > SAVE_MESSAGE_BYTES:
            # One message carries it: past this the rest is left out, and the file says so at its end.
            note = (f"\n\n[output capped: only the first {SAVE_MESSAGE_BYTES} of {len(encoded)} bytes were saved]\n")
            encoded = encoded[:SAVE_MESSAGE_BYTES] + note.encode()
        return await self._agent.save_output(name, encoded)
