"""PermissionService, EventService, operator policy, plugins and doom_loop over real gRPC.

The sandboxes are in-process agents (the local provider): these tests are about the control
plane's decisions; tests/docker/test_permissions.py runs the tools in real containers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from controlplane.client import ToolOutcome
from controlplane.core.permissions.permission import REJECTED_MESSAGE, corrected_message
from controlplane.v1 import event_pb2, tool_pb2
from tests.archives import tar_of
from tests.planes import Plane, served_plane
from tests.plugin_fixtures import rewrite

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]
POLICY = {
    "permission": {"bash": {"curl *": "deny"}},
    "tenants": {"alpha": {"webfetch": "deny", "bash": {"shutdown *": "deny"}}},
}
ASK_GIT = json.dumps({"permission": {"bash": {"*": "allow", "git *": "ask", "curl *": "allow"}}})


plane = served_plane("local", tenants=TENANTS, policy=POLICY, plugins={"modules": ["tests.plugin_fixtures.rewrite"]})


def bash(command: str) -> dict[str, str]:
    return {"command": command, "description": "Runs a command"}


async def start_call(plane: Plane, session_id: str, command: str, **kwargs: Any) -> tuple[
    grpc.aio.StreamStreamCall[tool_pb2.ExecuteToolRequest, tool_pb2.ToolEvent],
    asyncio.Queue[tool_pb2.ExecuteToolRequest | None],
]:
    return plane.client.tool_call(session_id, "bash", bash(command), **kwargs)


async def until_pending(plane: Plane, session_id: str, count: int) -> list[Any]:
    for _ in range(400):
        pending = await plane.client.pending_permissions(session_id)
        if len(pending) >= count:
            return pending
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {count} pending requests")


async def final(call: Any) -> tool_pb2.ToolEvent:
    last: tool_pb2.ToolEvent | None = None
    async for event in call:
        last = event
    assert last is not None
    return last


async def test_reply_from_another_connection_once_then_reject_with_feedback(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=ASK_GIT)
    call, outbox = await start_call(plane, session.id, "git --version")
    [pending] = await until_pending(plane, session.id, 1)
    assert pending.request.permission == "bash"
    assert list(pending.request.patterns) == ["git --version"]
    assert list(pending.request.always) == ["git --version *"]
    assert pending.session_id == session.id
    await plane.client.reply_permission(pending.request.id, "once")
    done = await final(call)
    assert done.WhichOneof("event") == "result"
    outbox.put_nowait(None)

    call, outbox = await start_call(plane, session.id, "git --version")  # once remembered nothing
    [pending] = await until_pending(plane, session.id, 1)
    await plane.client.reply_permission(pending.request.id, "reject", "use jj instead")
    done = await final(call)
    assert done.error.message == corrected_message("use jj instead")
    outbox.put_nowait(None)


async def test_reject_cascades_and_always_auto_resolves(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=ASK_GIT)
    calls = [await start_call(plane, session.id, cmd) for cmd in ("git log -1", "git status", "git diff")]
    pending = await until_pending(plane, session.id, 3)
    by_command = {p.request.patterns[0]: p.request.id for p in pending}
    await plane.client.reply_permission(by_command["git status"], "reject")
    results = [await final(c) for c, _ in calls]
    assert [r.error.message for r in results] == [REJECTED_MESSAGE] * 3
    for _, outbox in calls:
        outbox.put_nowait(None)

    calls = [await start_call(plane, session.id, cmd) for cmd in ("git status", "git status --short")]
    pending = await until_pending(plane, session.id, 2)
    first = next(p for p in pending if p.request.patterns[0] == "git status")
    assert list(first.request.always) == ["git status *"]
    await plane.client.reply_permission(first.request.id, "always")
    results = [await final(c) for c, _ in calls]
    assert [r.WhichOneof("event") for r in results] == ["result", "result"]
    assert await plane.client.pending_permissions(session.id) == []
    for _, outbox in calls:
        outbox.put_nowait(None)
    again = await plane.client.execute_tool(session.id, "bash", bash("git status -s"), on_permission=_refuse)
    assert again.error is None  # remembered for the session


async def _refuse(_: tool_pb2.PermissionRequest) -> tuple[int, str]:
    raise AssertionError("no permission request expected")


async def test_unknown_request_and_other_tenants_requests_are_not_found(plane: Plane) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plane.client.reply_permission("per_unknown", "once")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    session = await plane.client.create_session(config_json=ASK_GIT)
    call, outbox = await start_call(plane, session.id, "git --version")
    [pending] = await until_pending(plane, session.id, 1)
    from controlplane.client import AsyncClient

    async with AsyncClient(plane.plane.address, "token-beta") as beta:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await beta.reply_permission(pending.request.id, "once")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await beta.pending_permissions(session.id)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    call.cancel()
    outbox.put_nowait(None)


async def test_operator_deny_beats_project_allow_and_hides_tools(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=ASK_GIT)  # the project allows curl *
    out = await plane.client.execute_tool(session.id, "bash", bash("curl http://127.0.0.1:9/"))
    assert out.error is not None
    assert out.error.startswith("The user has specified a rule which prevents you from using this specific tool call.")
    assert '{"permission":"bash","pattern":"curl *","action":"deny"}' in out.error
    out = await plane.client.execute_tool(session.id, "bash", bash("shutdown -h now"))  # alpha's own policy
    assert out.error is not None
    assert "shutdown *" in out.error
    listed = [t.id for t in (await plane.client.list_tools(session.id, provider_id="opencode")).tools]
    assert "webfetch" not in listed
    assert "bash" in listed


async def test_operator_policy_beats_an_always_approval(plane: Plane) -> None:
    config = json.dumps({"permission": {"bash": {"*": "allow", "curl *": "ask"}}})
    session = await plane.client.create_session(config_json=config)
    out = await plane.client.execute_tool(session.id, "bash", bash("curl -s http://127.0.0.1:9/"))
    assert out.error is not None
    assert "curl *" in out.error


async def test_project_deny_and_legacy_tools_hide_tools(plane: Plane) -> None:
    config = json.dumps({"tools": {"write": False, "grep": False}, "permission": {"glob": "deny"}})
    session = await plane.client.create_session(config_json=config)
    listed = [t.id for t in (await plane.client.list_tools(session.id)).tools]
    for hidden in ("edit", "write", "grep", "glob"):
        assert hidden not in listed
    assert "read" in listed
    config = json.dumps({"tools": {"grep": False}, "permission": {"grep": "allow"}})  # explicit permission wins
    session = await plane.client.create_session(config_json=config)
    assert "grep" in [t.id for t in (await plane.client.list_tools(session.id)).tools]
    config = json.dumps({"agent": {"build": {"tools": {"bash": False}}}})
    session = await plane.client.create_session(config_json=config)
    assert "bash" not in [t.id for t in (await plane.client.list_tools(session.id)).tools]
    assert "bash" in [t.id for t in (await plane.client.list_tools(session.id, agent="plan")).tools]


async def test_before_hook_rewrites_the_command_that_runs(plane: Plane) -> None:
    session = await plane.client.create_session()
    out = await plane.client.execute_tool(session.id, "bash", bash("echo original"))
    assert out.output == "rewritten-by-plugin\n"
    out = await plane.client.execute_tool(session.id, "bash", bash("echo explode"))
    assert out.error == "refusing to run explode"  # the hook's own message, as upstream lets it through


async def test_after_hook_edits_and_a_failing_after_hook_loses_nothing(plane: Plane) -> None:
    session = await plane.client.create_session()
    out = await plane.client.execute_tool(session.id, "bash", bash("echo decorate"))
    assert out.output == "decorate\n[checked by plugin]"
    assert out.result is not None
    assert out.result.title == "decorated"
    out = await plane.client.execute_tool(session.id, "bash", bash("echo after-fails"))
    assert out.error is None
    assert out.output == "after-fails\n"


async def test_shell_env_and_tool_definition_hooks(plane: Plane) -> None:
    session = await plane.client.create_session()
    out = await plane.client.execute_tool(session.id, "bash", bash('echo "$PLUGIN_INJECTED"'))
    assert out.output == f"from-plugin:{session.id[:4]}\n"
    tools = {t.id: t for t in (await plane.client.list_tools(session.id)).tools}
    assert tools["glob"].description == "Glob, as the operator describes it."


async def test_permission_ask_hook_decides_before_the_user(plane: Plane) -> None:
    config = json.dumps({"permission": {"bash": {"*": "ask"}}})
    session = await plane.client.create_session(config_json=config)
    approved = bash("echo auto-approved-by-plugin")
    out = await plane.client.execute_tool(session.id, "bash", approved, on_permission=_refuse)
    assert out.output == "auto-approved-by-plugin\n"
    out = await plane.client.execute_tool(session.id, "bash", bash("echo auto-denied-by-plugin"), on_permission=_refuse)
    assert out.error == REJECTED_MESSAGE


async def test_doom_loop_asks_on_the_third_identical_call(plane: Plane) -> None:
    session = await plane.client.create_session()
    asked: list[tool_pb2.PermissionRequest] = []

    async def record(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    outcomes: list[ToolOutcome] = []
    for _ in range(3):
        outcomes.append(await plane.client.execute_tool(
            session.id, "glob", {"pattern": "*.nothing"}, message_id="msg_1", on_permission=record,
        ))
    assert [o.error for o in outcomes[:2]] == [None, None]
    assert [r.permission for r in asked] == ["doom_loop"]
    assert list(asked[0].patterns) == ["glob"]
    assert list(asked[0].always) == ["glob"]
    assert json.loads(asked[0].metadata_json) == {"tool": "glob", "input": {"pattern": "*.nothing"}}
    assert outcomes[2].error == REJECTED_MESSAGE
    other = await plane.client.execute_tool(
        session.id, "glob", {"pattern": "*.nothing"}, message_id="msg_2", on_permission=record,
    )
    assert other.error is None  # a new message starts a new run


async def test_events_stream_session_tool_and_permission_events(plane: Plane) -> None:
    stream = plane.client.subscribe_events()
    await stream.initial_metadata()
    session = await plane.client.create_session(config_json=ASK_GIT)
    call, outbox = await start_call(plane, session.id, "git --version")
    [pending] = await until_pending(plane, session.id, 1)
    await plane.client.reply_permission(pending.request.id, "once")
    await final(call)
    outbox.put_nowait(None)
    seen: list[event_pb2.Event] = []
    async for event in stream:
        if event.session_id == session.id:
            seen.append(event)
        if event.type == "tool.state" and json.loads(event.properties_json)["status"] == "completed":
            break
    stream.cancel()
    types = [e.type for e in seen]
    assert types[0] == "session.created"
    assert "permission.asked" in types
    assert "permission.replied" in types
    assert types.index("permission.asked") < types.index("permission.replied")
    replied = json.loads(seen[types.index("permission.replied")].properties_json)
    assert replied == {"sessionID": session.id, "requestID": pending.request.id, "reply": "once"}
    statuses = [json.loads(e.properties_json)["status"] for e in seen if e.type == "tool.state"]
    assert statuses == ["pending", "running", "completed"]
    assert any(e["type"] == "permission.replied" for e in rewrite.SEEN_EVENTS)  # the `event` plugin hook


async def test_events_of_one_session_and_tenant_isolation(plane: Plane) -> None:
    from controlplane.client import AsyncClient

    session = await plane.client.create_session()
    async with AsyncClient(plane.plane.address, "token-beta") as beta:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await beta.subscribe_events(session.id).read()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        beta_stream = beta.subscribe_events()
        await beta_stream.initial_metadata()
        mine = plane.client.subscribe_events(session.id)
        await mine.initial_metadata()
        await plane.client.execute_tool(session.id, "glob", {"pattern": "*.x"})
        event = await asyncio.wait_for(mine.read(), 5)
        assert isinstance(event, event_pb2.Event)
        assert event.type == "tool.state"
        assert event.session_id == session.id
        mine.cancel()
        await plane.client.delete_session(session.id)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(beta_stream.read(), 0.3)  # nothing of alpha's reaches beta
        beta_stream.cancel()


async def test_every_decision_is_audited(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=ASK_GIT)
    await plane.client.execute_tool(session.id, "bash", bash("echo audited"))
    await plane.client.execute_tool(session.id, "bash", bash("curl x"))

    async def reject(_: tool_pb2.PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, "no"

    await plane.client.execute_tool(session.id, "bash", bash("git push"), on_permission=reject)
    await plane.plane.audit.flush()
    entries = await plane.plane.store.audit_entries("alpha", session.id)
    decisions = [(e.outcome, e.patterns, e.rule) for e in entries if e.kind == "permission"]
    assert ("allow", ("echo audited",), "agent: bash * allow") in decisions
    assert ("deny", ("curl x",), "operator: bash curl * deny") in decisions
    assert ("reject", ("git push",), "client") in decisions
    calls = [(e.tool, e.outcome) for e in entries if e.kind == "call"]
    assert calls == [("bash", "ok"), ("bash", "denied"), ("bash", "denied")]
    assert all(e.tenant == "alpha" and e.session_id == session.id for e in entries)


async def test_a_read_deny_hides_grep_lines_when_a_hook_sees_every_ask(plane: Plane) -> None:
    """With a permission.ask hook every ask goes up, yet the agent still gets the rules (ToolStart.path_rules)
    to leave out what a read deny covers: grep shows no line of `.env`, nor of a symlink to it."""
    config = json.dumps({"permission": {"read": {"*": "allow", "*.env": "deny"}, "grep": "allow"}})
    session = await plane.client.create_session(
        config_json=config, workspace_archive=tar_of({".env": "TOKEN=hunter2\n", "a.txt": "hunter2 in plain\n"}))
    assert (await plane.client.run(session.id, ["ln", "-s", ".env", "notes.txt"])).exit_code == 0
    out = await plane.client.execute_tool(session.id, "grep", {"pattern": "hunter2"})
    assert "a.txt" in out.output
    assert ".env" not in out.output
    assert "notes.txt" not in out.output
