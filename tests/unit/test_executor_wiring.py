"""Reference §3/§4 through the real executor: truncation of results, when it is skipped, its hints,
the doom-loop ask, the `invalid` reroute and the order of validation, hooks and truncation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from controlplane.core.calls.executor import CallRequest, CallScope, ToolExecutor
from controlplane.core.calls.hooks import HookBus
from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.core.calls.tool_events import (
    CallEvent,
    CallStatus,
    Completed,
    Failed,
    PermissionRequested,
    StateChanged,
)
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import PermissionGate, Reply
from controlplane.core.permissions.permission import Rule
from controlplane.tools import invalid

OUTPUT_DIR = "/tmp/home/.local/share/opencode/tool-output"
AGENTS = permission.builtin_agents(OUTPUT_DIR, [], "/tmp/home/.local/share/opencode/plans", [], home="/tmp/home")


class Sandbox:
    """Keeps saved outputs in memory (the tools here never run in a sandbox)."""

    def __init__(self) -> None:
        self.saved: dict[str, str] = {}

    async def run_builtin(self, *_: Any) -> ToolResult:
        raise AssertionError("no sandbox tool expected")

    async def run_custom(self, *_: Any) -> ToolResult:
        raise AssertionError("no sandbox tool expected")

    async def plugin_hook(self, _: str, __: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        return output

    async def save_output(self, name: str, content: str) -> str:
        path = f"{OUTPUT_DIR}/{name}"
        self.saved[path] = content
        return path


class Text(BaseModel):
    text: str
    repeat: int = 1


def _tool(tool_id: str, result: Callable[[dict[str, Any]], ToolResult]) -> ToolInfo:
    async def execute(args: dict[str, Any], _: ToolContext) -> ToolResult:
        return result(args)

    async def init(_: InitContext) -> ToolDefinition:
        return ToolDefinition(f"{tool_id} tool", Text, execute)

    return ToolInfo(id=tool_id, init=init)


ECHO = _tool("echo", lambda a: ToolResult("echoed", a["text"] * a["repeat"], {"n": 1}))
SELF = _tool("self_truncating", lambda a: ToolResult("", a["text"] * a["repeat"], {"truncated": False}))
TOOLS = {"invalid": invalid.TOOL, "echo": ECHO, "self_truncating": SELF}


async def call(
    tool: str, args: Any, *, rules: list[Rule] | None = None, hooks: HookBus | None = None,
    sandbox: Sandbox | None = None, executor: ToolExecutor | None = None, message: str = "msg_1",
    on_ask: Callable[[PermissionRequested, PermissionGate], Awaitable[None]] | None = None,
) -> tuple[Completed | Failed, list[CallEvent]]:
    executor = executor or ToolExecutor(PermissionGate(), hooks or HookBus())
    scope = CallScope(
        session_id="ses_1", agent="build", ruleset=AGENTS["build"].permission if rules is None else rules,
        tools=TOOLS, sandbox=sandbox or Sandbox(), tenant="acme",
    )
    events: list[CallEvent] = []
    asks: list[asyncio.Task[None]] = []

    def emit(event: CallEvent) -> None:
        events.append(event)
        if isinstance(event, PermissionRequested) and on_ask is not None:
            asks.append(asyncio.ensure_future(on_ask(event, executor.gate)))

    text = args if isinstance(args, str) else json.dumps(args)
    await executor.execute(scope, CallRequest("ses_1", tool, text, f"call_{len(text)}", message), emit, asyncio.Event())
    await asyncio.gather(*asks)
    end = events[-1]
    assert isinstance(end, Completed | Failed)
    return end, events


# --- truncation (§4) -----------------------------------------------------------------------------


async def test_small_output_is_untouched_and_says_so() -> None:
    sandbox = Sandbox()
    # 2000 lines, the last one empty: one more "hi\n" would make 2001 and truncate
    end, events = await call("echo", {"text": "hi\n", "repeat": 1999}, sandbox=sandbox)
    assert isinstance(end, Completed)
    assert end.result.output == "hi\n" * 1999
    assert end.result.metadata == {"n": 1, "truncated": False}  # no outputPath key at all
    assert sandbox.saved == {}
    assert [e.status for e in events if isinstance(e, StateChanged)] == [
        CallStatus.PENDING, CallStatus.RUNNING, CallStatus.COMPLETED,
    ]


async def test_lines_over_the_limit_are_cut_with_the_task_hint_for_build() -> None:
    sandbox = Sandbox()
    end, _ = await call("echo", {"text": "x\n", "repeat": 2001}, sandbox=sandbox)  # 2002 lines
    assert isinstance(end, Completed)
    [(path, full)] = sandbox.saved.items()
    assert full == "x\n" * 2001
    name = path.rsplit("/", 1)[1]
    assert len(name) == len("tool_") + 12 + 14
    assert name.startswith("tool_")
    assert end.result.output == (
        "x\n" * 1999 + "x\n\n...2 lines truncated...\n\n"
        f"The tool call succeeded but the output was truncated. Full output saved to: {path}\n"
        "Use the Task tool to have explore agent process this file with Grep and Read (with offset/limit). "
        "Do NOT read the full file yourself - delegate to save context."
    )
    assert end.result.metadata == {"n": 1, "truncated": True, "outputPath": path}


async def test_bytes_over_the_limit_with_the_grep_hint_for_an_agent_denying_task() -> None:
    sandbox = Sandbox()
    line = "é" * 100  # 200 bytes
    end, _ = await call("echo", {"text": line + "\n", "repeat": 300}, rules=AGENTS["explore"].permission,
                        sandbox=sandbox)
    assert isinstance(end, Completed)
    [path] = sandbox.saved
    kept = 51200 // 201  # each kept line after the first costs 200 bytes + 1 newline
    total = 201 * 300  # 300 lines of 200 bytes and a newline each
    assert end.result.output == (
        "\n".join([line] * kept) + f"\n\n...{total - (kept * 201 - 1)} bytes truncated...\n\n"
        f"The tool call succeeded but the output was truncated. Full output saved to: {path}\n"
        "Use Grep to search the full content or Read with offset/limit to view specific sections."
    )


async def test_a_tool_that_sets_truncated_itself_is_not_truncated_again() -> None:
    sandbox = Sandbox()
    end, _ = await call("self_truncating", {"text": "y\n", "repeat": 5000}, sandbox=sandbox)
    assert isinstance(end, Completed)
    assert end.result.output == "y\n" * 5000
    assert end.result.metadata == {"truncated": False}
    assert sandbox.saved == {}


async def test_a_ruleset_denying_task_by_wildcard_gets_the_grep_hint() -> None:
    sandbox = Sandbox()
    rules = [Rule("*", "*", "allow"), Rule("ta*", "*", "deny"), Rule("task", "explore", "allow")]
    end, _ = await call("echo", {"text": "z" * 60000}, rules=rules, sandbox=sandbox)
    assert isinstance(end, Completed)
    assert end.result.output.startswith("\n\n...60000 bytes truncated...\n\nThe tool call succeeded")
    assert end.result.output.endswith("Use Grep to search the full content or Read with offset/limit to view "
                                      "specific sections.")


# --- doom loop (§3) ------------------------------------------------------------------------------


async def test_the_third_identical_call_asks_doom_loop_and_always_remembers_the_tool() -> None:
    executor = ToolExecutor(PermissionGate(), HookBus())
    seen: list[PermissionRequested] = []

    async def always(request: PermissionRequested, gate: PermissionGate) -> None:
        seen.append(request)
        await gate.reply(request.id, Reply.ALWAYS)

    args = {"text": "a", "repeat": 1}
    for _ in range(3):
        end, _events = await call("echo", args, executor=executor, on_ask=always)
        assert isinstance(end, Completed)
    assert [(r.permission, r.patterns, r.always, r.metadata) for r in seen] == [
        ("doom_loop", ["echo"], ["echo"], {"tool": "echo", "input": {"text": "a", "repeat": 1}}),
    ]
    end, _events = await call("echo", args, executor=executor, on_ask=always)  # 4th: approved for the session
    assert isinstance(end, Completed)
    assert len(seen) == 1


async def test_a_rejected_doom_loop_fails_the_call_and_another_message_starts_afresh() -> None:
    executor = ToolExecutor(PermissionGate(), HookBus())

    async def reject(request: PermissionRequested, gate: PermissionGate) -> None:
        await gate.reply(request.id, Reply.REJECT)

    for _ in range(2):
        await call("echo", {"text": "b"}, executor=executor, on_ask=reject)
    end, _ = await call("echo", {"text": "b"}, executor=executor, on_ask=reject)
    assert isinstance(end, Failed)
    assert end.message == "The user rejected permission to use this specific tool call."
    end, _ = await call("echo", {"text": "b"}, executor=executor, on_ask=reject, message="msg_2")
    assert isinstance(end, Completed)


async def test_doom_loop_allowed_by_config_does_not_ask() -> None:
    executor = ToolExecutor(PermissionGate(), HookBus())
    user = permission.from_config("allow", home="/tmp/home")  # `"permission": "allow"` comes after doom_loop: ask
    rules = permission.builtin_agents(OUTPUT_DIR, [], "/p", user, home="/tmp/home")["build"].permission
    for _ in range(4):
        end, events = await call("echo", {"text": "c"}, rules=rules, executor=executor)
        assert isinstance(end, Completed)
        assert not any(isinstance(e, PermissionRequested) for e in events)


# --- the invalid tool (§3, §6) -------------------------------------------------------------------


async def test_an_unknown_tool_is_rerouted_to_invalid() -> None:
    end, _ = await call("nope", {"x": 1})
    assert isinstance(end, Completed)
    assert end.result.title == "Invalid Tool"
    assert end.result.output == (
        "The arguments provided to the tool are invalid: "
        "Model tried to call unavailable tool 'nope'. Available tools: echo, self_truncating."
    )
    assert end.result.metadata == {"truncated": False}


async def test_a_tool_name_in_the_wrong_case_is_repaired() -> None:
    end, _ = await call("ECHO", {"text": "ok"})
    assert isinstance(end, Completed)
    assert end.result.output == "ok"


async def test_invalid_arguments_give_the_define_wrappers_message() -> None:
    end, events = await call("echo", {"repeat": 2})
    assert isinstance(end, Failed)
    assert end.message.startswith("The echo tool was called with invalid arguments: [\n")
    assert end.message.endswith("].\nPlease rewrite the input so it satisfies the expected schema.")
    assert [e.status for e in events if isinstance(e, StateChanged)][-1] is CallStatus.ERROR


# --- order of validation, hooks and truncation (§1, §3) -------------------------------------------


async def test_after_hook_sees_the_truncated_output_and_its_addition_is_kept() -> None:
    hooks = HookBus()
    seen: list[dict[str, Any]] = []

    async def after(_: dict[str, Any], output: dict[str, Any]) -> None:
        seen.append(dict(output["metadata"]))
        output["output"] += "\n[checked by plugin]"

    hooks.add("tool.execute.after", after, origin="test")
    end, _ = await call("echo", {"text": "w\n", "repeat": 3000}, hooks=hooks)
    assert isinstance(end, Completed)
    assert seen[0]["truncated"] is True
    assert "outputPath" in seen[0]
    assert end.result.output.endswith("\n[checked by plugin]")


async def test_arguments_a_before_hook_breaks_are_refused_by_validation() -> None:
    hooks = HookBus()

    async def before(_: dict[str, Any], output: dict[str, Any]) -> None:
        output["args"]["repeat"] = "many"

    hooks.add("tool.execute.before", before, origin="test")
    end, _ = await call("echo", {"text": "v"}, hooks=hooks)
    assert isinstance(end, Failed)
    assert end.message.startswith("The echo tool was called with invalid arguments:")
