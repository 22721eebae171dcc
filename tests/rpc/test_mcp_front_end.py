"""The MCP front end with the official SDK's client: `controlplane mcp SESSION` on stdio and the control plane's
streamable HTTP endpoint (`server.mcp_listen`), on both protocol eras (the handshake, and 2026's per-request
envelope where a permission ask travels as an InputRequiredResult)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.context import ClientRequestContext
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import Plane, served_plane, tenant_clients

OTHER = {"name": "other", "token": "other-tenant-token"}
TENANTS = [{"name": "mcp", "token": "mcp-tenant-token"}, OTHER]
plane = served_plane("local", tenants=TENANTS, server={"mcp_listen": "127.0.0.1:0"})
clients = tenant_clients(TENANTS)
FILES = {"notes.txt": "alpha\nbeta\n", ".env": "SECRET=1\n"}
TRANSPORTS = ["stdio", "http"]
MODES = ["legacy", "auto"]


@pytest.fixture(name="session_id")
async def session_fixture(plane: Plane) -> AsyncIterator[str]:
    async with AsyncClient(plane.plane.address, TENANTS[0]["token"]) as client:
        session = await client.create_session(workspace_archive=tar_of(FILES))
        yield session.id
        await client.delete_session(session.id)


@asynccontextmanager
async def mcp_client(plane: Plane, session_id: str, transport: str, *, mode: str = "auto",
                     elicit: ElicitationFnT | None = None, token: str = TENANTS[0]["token"]) -> AsyncIterator[Client]:
    if transport == "stdio":
        # Target and token from the environment, as an MCP client's config passes them.
        env = {**os.environ, "CONTROLPLANE_TARGET": plane.plane.address, "CONTROLPLANE_TOKEN": token}
        server: Any = StdioServerParameters(command=sys.executable, args=["-m", "controlplane", "mcp", session_id],
                                            env=env)
        async with Client(server, mode=mode, elicitation_callback=elicit) as client:
            yield client
        return
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    async with http, Client(streamable_http_client(url(plane, session_id), http_client=http), mode=mode,
                            elicitation_callback=elicit) as client:
        yield client


def url(plane: Plane, session_id: str) -> str:
    return f"http://{plane.plane.mcp_http.address}/mcp/{session_id}"


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_lists_and_calls_as_the_registry_does(plane: Plane, session_id: str, transport: str) -> None:
    async with AsyncClient(plane.plane.address, TENANTS[0]["token"]) as grpc_client:
        listing = await grpc_client.list_tools(session_id)
        direct = await grpc_client.execute_tool(session_id, "read", {"filePath": "notes.txt"})
    async with mcp_client(plane, session_id, transport) as client:
        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == [t.id for t in listing.tools]
        assert [t.input_schema for t in tools] == [json.loads(t.parameters_json_schema) for t in listing.tools]
        result = await client.call_tool("read", {"filePath": "notes.txt"})
        assert not result.is_error
        assert text(result) == direct.output
        assert "1: alpha" in text(result)
        failed = await client.call_tool("read", {})
        assert failed.is_error
        assert "invalid arguments" in text(failed)
        unknown = await client.call_tool("no_such_tool", {})
        assert unknown.is_error


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_permission_ask_is_an_elicitation(plane: Plane, session_id: str, transport: str, mode: str) -> None:
    asked: list[str] = []
    answer = {"action": "accept"}

    async def elicit(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=answer["action"], content={"always": False})  # type: ignore[arg-type]

    async with mcp_client(plane, session_id, transport, mode=mode, elicit=elicit) as client:
        accepted = await client.call_tool("read", {"filePath": ".env"})
        assert not accepted.is_error
        assert "SECRET=1" in text(accepted)
        assert len(asked) == 1
        assert "read" in asked[0]
        assert ".env" in asked[0]
        answer["action"] = "decline"
        declined = await client.call_tool("read", {"filePath": ".env"})
        assert declined.is_error
        assert "SECRET" not in text(declined)
        assert "rejected" in text(declined).lower()
        assert len(asked) == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_without_elicitation_an_ask_is_refused_with_the_reason(plane: Plane, session_id: str,
                                                                     transport: str) -> None:
    async with mcp_client(plane, session_id, transport, mode="legacy") as client:
        refused = await client.call_tool("read", {"filePath": ".env"})
    assert refused.is_error
    assert "SECRET" not in text(refused)
    assert "declined no elicitation support" in text(refused) or "cannot be asked" in text(refused)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_live_metadata_becomes_progress(plane: Plane, session_id: str, transport: str) -> None:
    notes: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    command = "for i in one two three; do echo $i; sleep 0.3; done"
    async with mcp_client(plane, session_id, transport) as client:
        result = await client.call_tool("bash", {"command": command, "description": "Count"},
                                        progress_callback=progress)
    assert not result.is_error
    assert text(result).split() == ["one", "two", "three"]
    assert len(notes) >= 2, notes
    assert "".join(notes).split() == ["one", "two", "three"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancelling_the_request_aborts_the_call(plane: Plane, session_id: str, transport: str,
                                                      mode: str) -> None:
    marker = f"mcpcancel{transport}{mode}"
    started = anyio.Event()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    command = f"echo started; exec -a {marker} sleep 60"
    async with mcp_client(plane, session_id, transport, mode=mode) as client:
        async with anyio.create_task_group() as group:
            async def call() -> None:
                await client.call_tool("bash", {"command": command, "description": "Wait"},
                                       progress_callback=progress)
            group.start_soon(call)
            with anyio.fail_after(20):
                await started.wait()
            assert await running(plane, session_id, marker)
            group.cancel_scope.cancel()
        deadline = time.monotonic() + 10
        while await running(plane, session_id, marker):
            assert time.monotonic() < deadline, "the cancelled call's command still runs"
            await asyncio.sleep(0.2)
        # The connection serves on after the cancellation.
        assert not (await client.call_tool("read", {"filePath": "notes.txt"})).is_error


async def running(plane: Plane, session_id: str, marker: str) -> bool:
    async with AsyncClient(plane.plane.address, TENANTS[0]["token"]) as client:
        done = await client.run(session_id, ["sh", "-c", "ps -eo args"])
    return any(line.startswith(marker) for line in done.stdout.decode().splitlines())


async def test_http_needs_the_tenants_token_and_its_session(plane: Plane, session_id: str,
                                                            clients: dict[str, AsyncClient]) -> None:
    other = await clients["other"].create_session()
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient(timeout=10) as http:
        no_token = await http.post(url(plane, session_id), json=body, headers=headers)
        assert no_token.status_code == 401
        assert no_token.headers["www-authenticate"].startswith("Bearer")
        wrong = await http.post(url(plane, session_id), json=body, headers={**headers, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        theirs = await http.post(url(plane, other.id), json=body,
                                 headers={**headers, "Authorization": f"Bearer {TENANTS[0]['token']}"})
        assert theirs.status_code == 404
        bad_path = await http.post(f"http://{plane.plane.mcp_http.address}/mcp/",
                                   json=body, headers={**headers, "Authorization": f"Bearer {TENANTS[0]['token']}"})
        assert bad_path.status_code == 404
    # The other tenant reaches its own session there.
    async with mcp_client(plane, other.id, "http", token=OTHER["token"]) as client:
        assert [t.name for t in (await client.list_tools()).tools]


async def test_another_credential_cannot_ride_an_mcp_session(plane: Plane, session_id: str,
                                                             clients: dict[str, AsyncClient]) -> None:
    """The MCP session id an initialize returned, replayed with another tenant's token on its own session."""
    other = await clients["other"].create_session()
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {TENANTS[0]['token']}"}
    async with httpx2.AsyncClient(timeout=10) as http:
        opened = await http.post(url(plane, session_id), json=body, headers=headers)
        assert opened.status_code == 200
        mcp_session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        replayed = await http.post(url(plane, other.id), json=listing, headers={
            **headers, "Authorization": f"Bearer {OTHER['token']}", "mcp-session-id": mcp_session,
            "mcp-protocol-version": "2025-06-18"})
        assert replayed.status_code == 404
        await http.delete(url(plane, session_id), headers={**headers, "mcp-session-id": mcp_session,
                                                           "mcp-protocol-version": "2025-06-18"})


async def test_stdio_refuses_an_unknown_session_before_serving(plane: Plane) -> None:
    env = {**os.environ, "CONTROLPLANE_TARGET": plane.plane.address, "CONTROLPLANE_TOKEN": TENANTS[0]["token"]}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controlplane", "mcp", "ses_missing", env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(child.communicate(), 30)
    assert child.returncode == 2
    assert out == b""
    assert b"NOT_FOUND" in err


async def test_one_token_cannot_take_every_mcp_session(plane: Plane, session_id: str,
                                                       clients: dict[str, AsyncClient]) -> None:
    from controlplane.mcp_front.http import MAX_SESSIONS_PER_TOKEN

    other = await clients["other"].create_session()
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    mine = {**accept, "Authorization": f"Bearer {TENANTS[0]['token']}"}
    opened: list[str] = []
    async with httpx2.AsyncClient(timeout=10) as http:
        try:
            # Other tests of the module may hold a few of this token's sessions still (they idle out later).
            while (answer := await http.post(url(plane, session_id), json=body, headers=mine)).status_code == 200:
                opened.append(answer.headers["mcp-session-id"])
                assert len(opened) <= MAX_SESSIONS_PER_TOKEN
            assert answer.status_code == 429
            assert opened
            theirs = await http.post(url(plane, other.id), json=body, headers={
                **accept, "Authorization": f"Bearer {OTHER['token']}"})
            assert theirs.status_code == 200
            closed = await http.delete(url(plane, session_id), headers={
                **mine, "mcp-session-id": opened.pop(), "mcp-protocol-version": "2025-06-18"})
            assert closed.status_code == 200
            again = await http.post(url(plane, session_id), json=body, headers=mine)
            assert again.status_code == 200
            opened.append(again.headers["mcp-session-id"])
        finally:
            for mcp_session in opened:
                await http.delete(url(plane, session_id), headers={
                    **mine, "mcp-session-id": mcp_session, "mcp-protocol-version": "2025-06-18"})
