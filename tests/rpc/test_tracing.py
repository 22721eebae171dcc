"""The control plane's spans over real gRPC (in-process agents), recorded by an in-memory SDK exporter.

Checks the tree (client span -> gRPC server span -> execute_tool -> init_tool / hooks / permission
waits), the GenAI and `sandbox.*` attributes, and how errors, denials and cancellations end.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from controlplane.client import allow_once
from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane
from tests.tracing import memory_exporter

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
POLICY = {"permission": {"bash": {"curl *": "deny"}}}
ASK_GIT = json.dumps({"permission": {"bash": {"*": "allow", "git *": "ask"}}})
EXECUTE_RPC = "/controlplane.v1.ToolService/ExecuteTool"
test_tracer = trace.get_tracer("tests.rpc.test_tracing")
MCP_SERVER = str(Path(__file__).resolve().parent.parent / "unit" / "mcp" / "stdio_server.py")


@pytest.fixture(scope="module")
def sdk_provider() -> None:
    memory_exporter()  # the SDK provider must exist before the server is built (it adds the interceptor then)


plane = served_plane("local", needs=("sdk_provider",), tenants=TENANTS, policy=POLICY,
                     plugins={"modules": ["tests.plugin_fixtures.rewrite"]})


@pytest.fixture
def exported() -> Callable[[], Sequence[ReadableSpan]]:
    exporter = memory_exporter()
    exporter.clear()
    return exporter.get_finished_spans


async def wait_for_span(
    exported: Callable[[], Sequence[ReadableSpan]], name: str, **attributes: Any,
) -> ReadableSpan:
    """Server spans end a moment after the client saw the last event, so poll."""
    for _ in range(300):
        for span in exported():
            if span.name == name and all((span.attributes or {}).get(k) == v for k, v in attributes.items()):
                return span
        await asyncio.sleep(0.01)
    raise AssertionError(f"no span {name} {attributes}; have {sorted({s.name for s in exported()})}")


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan, name: str | None = None) -> list[ReadableSpan]:
    assert parent.context is not None
    return [
        s for s in spans
        if s.parent is not None and s.parent.span_id == parent.context.span_id and (name is None or s.name == name)
    ]


def permission_events(span: ReadableSpan) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == "permission"]


async def run_call(
    plane: Plane, session_id: str, command: str, call_id: str, *, metadata: tuple[tuple[str, str], ...] = (),
    reply: int | None = None,
) -> list[tool_pb2.ToolEvent]:
    """One bash call on the raw stub (so extra metadata can be sent), answering an ask with `reply`."""
    outbox: asyncio.Queue[tool_pb2.ExecuteToolRequest | None] = asyncio.Queue()
    args = json.dumps({"command": command, "description": "Runs a command"})
    outbox.put_nowait(tool_pb2.ExecuteToolRequest(call=tool_pb2.ToolCall(
        session_id=session_id, tool="bash", args_json=args, call_id=call_id,
    )))

    async def requests() -> AsyncIterator[tool_pb2.ExecuteToolRequest]:
        while (item := await outbox.get()) is not None:
            yield item

    auth = (("authorization", f"Bearer {plane.token}"),)
    stream = plane.client.tools.ExecuteTool(requests(), metadata=auth + metadata)
    events = []
    async for event in stream:
        events.append(event)
        kind = event.WhichOneof("event")
        if kind == "permission_request" and reply is not None:
            answer = tool_pb2.PermissionReply(request_id=event.permission_request.id, reply=reply)  # type: ignore[arg-type]
            outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=answer))
        if kind in ("result", "error"):
            break
    outbox.put_nowait(None)
    return events


async def test_a_call_continues_the_clients_trace_and_carries_genai_and_sandbox_attributes(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    with test_tracer.start_as_current_span("client call") as client_span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        events = await run_call(plane, session.id, "echo decorate", "call_traced_1",
                                metadata=tuple(carrier.items()))
    output = events[-1].result.output
    assert output == "decorate\n[checked by plugin]"

    call = await wait_for_span(exported, "execute_tool bash", **{"gen_ai.tool.call.id": "call_traced_1"})
    server = await wait_for_span(exported, EXECUTE_RPC)
    spans = exported()
    assert server.kind is SpanKind.SERVER
    assert server.context is not None
    assert call.context is not None
    assert server.context.trace_id == client_span.get_span_context().trace_id
    assert server.parent is not None
    assert server.parent.span_id == client_span.get_span_context().span_id
    assert call.parent is not None
    assert call.parent.span_id == server.context.span_id
    assert call.kind is SpanKind.INTERNAL
    assert dict(call.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "bash",
        "gen_ai.tool.call.id": "call_traced_1",
        "sandbox.session.id": session.id,
        "sandbox.tenant": "alpha",
        "sandbox.id": session.sandbox_id,
        "sandbox.tool.source": "BUILTIN",
        "sandbox.tool.origin": "builtin",
        "sandbox.outcome": "ok",
        "sandbox.truncated": False,
        "sandbox.output.bytes": len(output.encode()),
    }
    assert call.status.status_code is StatusCode.UNSET
    assert [s.name for s in children(spans, call, "init_tool bash")] == ["init_tool bash"]
    hooks = sorted((s.name, s.attributes.get("sandbox.hook.plugin") if s.attributes else None)
                   for s in children(spans, call) if s.name.startswith("run_hook") and s.name != "run_hook event")
    assert hooks == [
        ("run_hook shell.env", "tests.plugin_fixtures.rewrite"),
        ("run_hook tool.execute.after", "tests.plugin_fixtures.rewrite"),
        ("run_hook tool.execute.before", "tests.plugin_fixtures.rewrite"),
    ]
    # The plugin's `event` hook sees the call's state changes from inside the call's trace too.
    assert "run_hook event" in {s.name for s in children(spans, call)}
    # The default agent allows bash by rule: nobody waited, so an event on the call says so (no span).
    assert permission_events(call) == [{
        "sandbox.permission": "bash", "sandbox.permission.patterns": ("echo decorate",),
        "sandbox.permission.decision": "auto-allow", "sandbox.permission.rule": "agent: * * allow",
    }]
    assert not [s for s in children(spans, call) if s.name.startswith("await_permission")]


async def test_without_traceparent_the_server_span_is_a_root(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    await run_call(plane, session.id, "echo x", "call_root")
    call = await wait_for_span(exported, "execute_tool bash", **{"gen_ai.tool.call.id": "call_root"})
    server = await wait_for_span(exported, EXECUTE_RPC)
    assert server.parent is None
    assert call.parent is not None
    assert server.context is not None
    assert call.parent.span_id == server.context.span_id


async def test_a_cancelled_call_ends_in_error_with_outcome_cancelled(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    task = asyncio.ensure_future(run_call(plane, session.id, "sleep 30", "call_to_cancel"))
    for _ in range(500):
        if await plane.client.cancel_tool_call(session.id, "call_to_cancel"):
            break
        await asyncio.sleep(0.01)
    events = await asyncio.wait_for(task, 20)
    # bash reports what the aborted command printed as its result; the call still counts as cancelled.
    assert events[-1].WhichOneof("event") == "result"
    call = await wait_for_span(exported, "execute_tool bash", **{"gen_ai.tool.call.id": "call_to_cancel"})
    assert call.attributes is not None
    assert call.attributes["sandbox.outcome"] == "cancelled"
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description == "Tool execution aborted"
    assert [e.name for e in call.events] == ["permission", "cancelled"]
    assert call.attributes["sandbox.output.bytes"] == len(events[-1].result.output.encode())


async def test_a_call_denied_by_operator_policy_shows_the_decision_and_the_rule(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    events = await run_call(plane, session.id, "curl http://127.0.0.1:9/", "call_denied")
    message = events[-1].error.message
    assert message.startswith("The user has specified a rule which prevents you from using this specific tool call.")
    call = await wait_for_span(exported, "execute_tool bash", **{"gen_ai.tool.call.id": "call_denied"})
    assert call.attributes is not None
    assert call.attributes["sandbox.outcome"] == "denied"
    assert call.status.status_code is StatusCode.ERROR
    assert call.status.description == message
    assert permission_events(call) == [{
        "sandbox.permission": "bash",
        "sandbox.permission.patterns": ("curl http://127.0.0.1:9/",),
        "sandbox.permission.decision": "deny",
        "sandbox.permission.rule": "operator: bash curl * deny",
    }]
    assert [e.name for e in call.events] == ["permission", "exception"]


@pytest.mark.parametrize(("reply", "decision", "outcome"), [
    (tool_pb2.PermissionReply.ONCE, "once", "ok"),
    (tool_pb2.PermissionReply.REJECT, "reject", "denied"),
])
async def test_a_permission_wait_names_the_users_decision(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]], reply: int, decision: str, outcome: str,
) -> None:
    session = await plane.client.create_session(config_json=ASK_GIT)
    call_id = f"call_asked_{decision}"
    events = await run_call(plane, session.id, "git --version", call_id, reply=reply)
    assert [e.WhichOneof("event") for e in events].count("permission_request") == 1
    call = await wait_for_span(exported, "execute_tool bash", **{"gen_ai.tool.call.id": call_id})
    assert call.attributes is not None
    assert call.attributes["sandbox.outcome"] == outcome
    [wait] = children(exported(), call, "await_permission bash")
    assert wait.attributes is not None
    assert wait.attributes["sandbox.session.id"] == session.id
    assert wait.attributes["gen_ai.tool.call.id"] == call_id
    assert wait.attributes["sandbox.permission.patterns"] == ("git --version",)
    assert wait.attributes["sandbox.permission.decision"] == decision
    assert wait.attributes["sandbox.permission.rule"] == "client"
    expected = StatusCode.UNSET if decision == "once" else StatusCode.ERROR
    assert wait.status.status_code is expected
    assert wait.end_time is not None
    assert wait.start_time is not None
    assert wait.end_time > wait.start_time


async def test_an_allowed_ask_is_auto_allowed_by_its_rule(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session(config_json=ASK_GIT)
    # The read tool asks `read` for its path; the default agent allows it by rule (no one is asked).
    outcome = await plane.client.execute_tool(session.id, "read", {"filePath": "/nonexistent/file"},
                                              call_id="call_read", on_permission=allow_once)
    assert outcome.error is not None
    call = await wait_for_span(exported, "execute_tool read", **{"gen_ai.tool.call.id": "call_read"})
    assert call.attributes is not None
    assert call.attributes["sandbox.outcome"] == "error"
    [event] = permission_events(call)
    assert event["sandbox.permission.decision"] == "auto-allow"
    assert event["sandbox.permission.rule"] == "agent: read * allow"


async def test_a_failing_before_hook_fails_its_span_and_the_call(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    events = await run_call(plane, session.id, "echo explode", "call_explode")
    message = events[-1].error.message
    assert message == "refusing to run explode"  # the hook's own message, as upstream lets it through
    call = await wait_for_span(exported, "execute_tool bash", **{"gen_ai.tool.call.id": "call_explode"})
    assert call.attributes is not None
    assert call.attributes["sandbox.outcome"] == "error"
    assert call.status.description == message
    [hook] = children(exported(), call, "run_hook tool.execute.before")
    assert hook.status.status_code is StatusCode.ERROR
    assert hook.status.description == "RuntimeError: refusing to run explode"
    [event] = hook.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "RuntimeError"


async def test_an_unknown_tool_is_traced_under_the_name_the_client_used(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    outcome = await plane.client.execute_tool(session.id, "no_such_tool", {}, call_id="call_unknown")
    call = await wait_for_span(exported, "execute_tool no_such_tool")
    assert call.attributes is not None
    assert call.attributes["sandbox.tool.source"] == ""
    # The `invalid` tool answers it (as upstream does): the model reads the error as a result.
    expected = "ok" if outcome.error is None else "error"
    assert call.attributes["sandbox.outcome"] == expected
    [init] = children(exported(), call, "init_tool invalid")
    assert init.attributes is not None
    assert init.attributes["gen_ai.tool.name"] == "invalid"


async def test_session_create_and_sandbox_acquire(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    created = await wait_for_span(exported, "create_session", **{"sandbox.session.id": session.id})
    server = await wait_for_span(exported, "/controlplane.v1.SessionService/CreateSession")
    assert created.parent is not None
    assert server.context is not None
    assert created.parent.span_id == server.context.span_id
    assert dict(created.attributes or {}) == {
        "sandbox.tenant": "alpha", "sandbox.session.id": session.id, "sandbox.id": session.sandbox_id,
    }
    [acquire] = children(exported(), created, "acquire_sandbox")
    assert dict(acquire.attributes or {}) == {
        "sandbox.session.id": session.id, "sandbox.id": session.sandbox_id, "sandbox.pool.hit": False,
    }


async def test_a_failed_session_create_ends_in_error(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    with pytest.raises(Exception, match="config_json is not valid JSON"):
        await plane.client.create_session(config_json="{nope")
    created = await wait_for_span(exported, "create_session")
    assert created.status.status_code is StatusCode.ERROR
    assert created.status.description is not None
    assert created.status.description.startswith("InvalidArgumentError: config_json is not valid JSON")
    assert "sandbox.session.id" not in (created.attributes or {})


async def test_listing_inits_every_listed_builtin_under_the_list_tools_span(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    session = await plane.client.create_session()
    listing = await plane.client.list_tools(session.id)
    server = await wait_for_span(exported, "/controlplane.v1.ToolService/ListTools")
    inits = children(exported(), server)
    listed = [t.id for t in listing.tools]
    assert sorted(s.name for s in inits if s.name.startswith("init_tool")) == sorted(f"init_tool {t}" for t in listed)
    glob = next(s for s in inits if s.name == "init_tool glob")
    assert dict(glob.attributes or {}) == {
        "gen_ai.tool.name": "glob", "sandbox.tool.source": "BUILTIN", "sandbox.tool.origin": "builtin",
    }
    # The operator's tool.definition hook runs once per listed tool, after its init.
    assert [s.name for s in inits].count("run_hook tool.definition") == len(listed)


async def test_connecting_mcp_servers_is_an_init_span_per_server(
    plane: Plane, exported: Callable[[], Sequence[ReadableSpan]],
) -> None:
    server_script = MCP_SERVER
    session = await plane.client.create_session(config_json=json.dumps({"mcp": {
        "notes": {"type": "local", "command": [sys.executable, server_script, "ok"]},
        "broken": {"type": "local", "command": [sys.executable, server_script, "crash"]},
    }}))
    listing = await plane.client.list_tools(session.id)
    server = await wait_for_span(exported, "/controlplane.v1.ToolService/ListTools")
    notes = await wait_for_span(exported, "init_tool mcp:notes")
    broken = await wait_for_span(exported, "init_tool mcp:broken")
    assert notes.parent is not None
    assert server.context is not None
    assert notes.parent.span_id == server.context.span_id
    listed = [t.id for t in listing.tools if t.source == tool_pb2.ToolDefinition.MCP]
    assert dict(notes.attributes or {}) == {
        "sandbox.tool.source": "MCP", "sandbox.mcp.server": "notes", "sandbox.mcp.tools": len(listed),
    }
    assert notes.status.status_code is StatusCode.UNSET
    assert broken.status.status_code is StatusCode.ERROR
    [problem] = [e for e in listing.load_errors if e.origin == "broken"]
    assert broken.status.description == problem.message
    mcp_inits = [s.name for s in children(exported(), server) if s.name.startswith("init_tool notes_")]
    assert sorted(mcp_inits) == sorted(f"init_tool {t}" for t in listed)
