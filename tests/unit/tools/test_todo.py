"""todowrite/todoread through the real executor and permission gate, with an in-memory store."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from controlplane.core.calls.executor import CallRequest, CallScope, ToolExecutor
from controlplane.core.calls.hooks import HookBus
from controlplane.core.calls.tool import ToolResult
from controlplane.core.calls.tool_events import CallEvent, Completed, Failed, PermissionRequested
from controlplane.core.permissions.asks import PermissionGate
from controlplane.core.permissions.permission import Rule
from controlplane.core.sessions.events import BusEvent, EventBus
from controlplane.core.sessions.services import MemoryTodos, SessionServices
from controlplane.tools import invalid, todoread, todowrite


class NoSandbox:
    """Todo tools never reach a sandbox; any attempt is a test failure."""

    async def run_builtin(self, *_: Any) -> ToolResult:
        raise AssertionError("no sandbox call expected")

    async def save_output(self, *_: Any) -> str:
        raise AssertionError("no sandbox call expected")

    async def run_custom(self, *_: Any) -> ToolResult:
        raise AssertionError("no sandbox call expected")

    async def plugin_hook(self, *_: Any) -> dict[str, Any]:
        raise AssertionError("no sandbox call expected")


async def run(tool: str, args: dict[str, Any], services: SessionServices, session: str = "ses_1",
              rules: list[Rule] | None = None) -> tuple[Completed | Failed, list[CallEvent]]:
    executor = ToolExecutor(PermissionGate(), HookBus())
    scope = CallScope(
        session_id=session, agent="build", ruleset=rules or [Rule("*", "*", "allow")],
        tools={"invalid": invalid.TOOL, "todowrite": todowrite.TOOL, "todoread": todoread.TOOL},
        sandbox=NoSandbox(), tenant="acme", services=services,
    )
    events: list[CallEvent] = []
    await executor.execute(scope, CallRequest(session, tool, json.dumps(args), "call_1"), events.append,
                           asyncio.Event())
    end = events[-1]
    assert isinstance(end, Completed | Failed)
    return end, events


async def test_key_order_as_sent_numbers_as_javascript_writes_them() -> None:
    services = SessionServices(todos=MemoryTodos())
    todos = [{"priority": "low", "status": "pending", "content": "a\n\"b\"", "10": 2.5, "2": 3.0}]
    end, _ = await run("todowrite", {"todos": todos}, services)
    assert isinstance(end, Completed)
    assert end.result.output == (
        '[\n  {\n    "2": 3,\n    "10": 2.5,\n    "priority": "low",\n    "status": "pending",\n'
        '    "content": "a\\n\\"b\\""\n  }\n]'
    )
    assert end.result.title == "1 todos"


async def test_lists_are_per_session_and_published() -> None:
    bus = EventBus()
    seen: list[BusEvent] = []

    async def listen(event: BusEvent) -> None:
        seen.append(event)

    bus.listen(listen)
    store = MemoryTodos()

    def publish(type_: str, **properties: Any) -> None:
        bus.publish(type_, "acme", "ses_1", **properties)

    services = SessionServices(todos=store, publish=publish)
    todos = [{"content": "x", "status": "completed", "priority": "high"}]
    await run("todowrite", {"todos": todos}, services)
    assert await store.get_todos("ses_1") == todos
    assert await store.get_todos("ses_2") == []
    end, _ = await run("todoread", {}, services, session="ses_2")
    assert isinstance(end, Completed)
    assert (end.result.output, end.result.title, end.result.metadata["todos"]) == ("[]", "0 todos", [])
    await asyncio.sleep(0)
    assert [(e.type, e.properties) for e in seen] == [("todo.updated", {"sessionID": "ses_1", "todos": todos})]


async def test_asks_its_own_permission_and_needs_a_store() -> None:
    end, events = await run("todowrite", {"todos": []}, SessionServices(todos=MemoryTodos()),
                            rules=[Rule("*", "*", "allow"), Rule("todowrite", "*", "deny")])
    assert isinstance(end, Failed)
    assert end.message.startswith("The user has specified a rule which prevents you from using this specific tool call")
    assert not [e for e in events if isinstance(e, PermissionRequested)]
    end, _ = await run("todoread", {}, SessionServices())
    assert isinstance(end, Failed)
    assert end.message == "This session has no todo storage."
