"""ToolService semantics over real gRPC with in-process agents: states, asks, replies, aborts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.client import AsyncClient, PermissionRequest
from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]
ENV_CONFIG = json.dumps({"permission": {"bash": {"*": "allow", "rm *": "deny", "git *": "ask"}}})


plane = served_plane("local", tenants=TENANTS)


@pytest.fixture(scope="module")
async def session_id(plane: Plane) -> str:
    session = await plane.client.create_session(config_json=ENV_CONFIG)
    return session.id


async def test_bash_round_trip_and_states(plane: Plane, session_id: str) -> None:
    out = await plane.client.execute_tool(session_id, "bash", {"command": "echo hi", "description": "Greets"})
    assert out.output == "hi\n"
    kinds = [e.WhichOneof("event") for e in out.events]
    assert kinds[:2] == ["state", "state"]
    assert kinds[-2:] == ["state", "result"]
    assert [e.seq for e in out.events] == list(range(1, len(out.events) + 1))
    assert all(e.call_id == out.call_id for e in out.events)


async def test_config_deny_fails_with_the_rules(plane: Plane, session_id: str) -> None:
    out = await plane.client.execute_tool(session_id, "bash", {"command": "rm -rf x", "description": "Remove"})
    assert out.error is not None
    assert out.error.startswith(
        "The user has specified a rule which prevents you from using this specific tool call. "
        "Here are some of the relevant rules ["
    )
    assert '{"permission":"bash","pattern":"rm *","action":"deny"}' in out.error


async def test_always_remembers_for_the_session(plane: Plane, session_id: str) -> None:
    asked: list[PermissionRequest] = []

    async def always(request: PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.ALWAYS, ""

    first = await plane.client.execute_tool(
        session_id, "bash", {"command": "git status || true", "description": "Status"}, on_permission=always
    )
    assert first.result is not None
    assert [(r.permission, list(r.patterns), list(r.always)) for r in asked] == [
        ("bash", ["git status", "true"], ["git status *", "true *"])
    ]
    args = {"command": "git status -s || true", "description": "S"}
    second = await plane.client.execute_tool(session_id, "bash", args)
    assert second.result is not None
    assert second.permission_requests == []
    other = client_for(plane, "token-alpha")
    fresh = await other.create_session(config_json=ENV_CONFIG)
    asked.clear()
    third = await other.execute_tool(fresh.id, "bash", {"command": "git status || true", "description": "S"},
                                     on_permission=always)
    assert third.result is not None
    assert len(asked) == 1
    await other.close()


def client_for(plane: Plane, token: str) -> AsyncClient:
    return AsyncClient(plane.plane.address, token)


async def test_pending_request_answered_from_another_connection_path(plane: Plane, session_id: str) -> None:
    stream, outbox = plane.client.tool_call(session_id, "bash", {"command": "git log -1 || true", "description": "L"})
    request_id = ""
    async for event in stream:
        if event.WhichOneof("event") == "permission_request":
            request_id = event.permission_request.id
            assert request_id.startswith("per_")
            outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="no")))
        if event.WhichOneof("event") == "error":
            assert event.error.message == "Tool execution aborted"
            break
    outbox.put_nowait(None)
    assert request_id


async def test_cancel_of_unknown_call_and_strangers(plane: Plane, session_id: str) -> None:
    assert await plane.client.cancel_tool_call(session_id, "call_nope") is False
    beta = client_for(plane, "token-beta")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await beta.cancel_tool_call(session_id, "call_nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await beta.execute_tool(session_id, "bash", {"command": "id", "description": "Who"})
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    await beta.close()


async def test_first_message_must_be_a_call(plane: Plane) -> None:
    async def requests() -> AsyncIterator[tool_pb2.ExecuteToolRequest]:
        yield tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="x"))

    call = plane.client.tools.ExecuteTool(requests(), metadata=(("authorization", "Bearer token-alpha"),))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_many_parallel_calls(plane: Plane, session_id: str) -> None:
    outs = await asyncio.gather(*(
        plane.client.execute_tool(session_id, "bash", {"command": f"echo {i}", "description": "N"}) for i in range(20)
    ))
    assert [o.output for o in outs] == [f"{i}\n" for i in range(20)]
