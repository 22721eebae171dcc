"""The MCP client configurations docs/mcp.md documents, run as written there (placeholders filled in), and the
2026-protocol ask's parked call against a hostile or absent client."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from controlplane.client import AsyncClient
from controlplane.mcp import McpServers, parse_mcp_config
from controlplane.mcp_front import bridge
from tests.archives import tar_of
from tests.planes import Plane, served_plane

DOC = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"
TENANTS = [{"name": "cfg", "token": "cfg-tenant-token"}, {"name": "intruder", "token": "intruder-token"}]
plane = served_plane("local", tenants=TENANTS, server={"mcp_listen": "127.0.0.1:0"})
FILES = {"notes.txt": "alpha\n", ".env": "SECRET=1\n"}


@pytest.fixture(name="session_id")
async def session_fixture(plane: Plane) -> AsyncIterator[str]:
    async with AsyncClient(plane.plane.address, TENANTS[0]["token"]) as client:
        session = await client.create_session(workspace_archive=tar_of(FILES))
        yield session.id
        await client.delete_session(session.id)


def documented(key: str, plane: Plane, session_id: str) -> dict[str, Any]:
    """The doc's JSON block holding `key`, its placeholders replaced by this plane's values."""
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), re.DOTALL)
    text = next(b for b in blocks if f'"{key}"' in b)
    text = re.sub(r"\bTOKEN\b", TENANTS[0]["token"], text.replace("SESSION_ID", session_id))  # not ..._TOKEN
    text = text.replace("127.0.0.1:50061", plane.plane.address).replace("127.0.0.1:50062", plane.plane.mcp_http.address)
    found: dict[str, Any] = json.loads(text)
    return found


def stdio_params(command: str, args: list[str], env: dict[str, str]) -> StdioServerParameters:
    # `controlplane` is the venv's entry point; the client starts what the config names, with the config's env.
    return StdioServerParameters(command=command, args=args, env={"PATH": os.environ["PATH"], **env})


async def read_notes(client: Client) -> str:
    result = await client.call_tool("read", {"filePath": "notes.txt"})
    assert not result.is_error
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_the_opencode_config(plane: Plane, session_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    document = documented("mcp", plane, session_id)
    config = parse_mcp_config(document)
    assert not config.problems
    remote = McpServers.from_config(None, parse_mcp_config({"mcp": {"sandbox-http": document["mcp"]["sandbox-http"]}}))
    try:
        statuses = await remote.connect_all()
        assert statuses["sandbox-http"].status == "connected", statuses
        names = [tool.name for _, tool in remote.tools()]
        assert "read" in names
        assert "bash" in names
        result = await remote.call("sandbox-http", "read", {"filePath": "notes.txt"}, asyncio.Event())
        assert "1: alpha" in json.dumps(result.model_dump(mode="json"))
    finally:
        await remote.close()
    local = document["mcp"]["sandbox"]
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    params = stdio_params(local["command"][0], local["command"][1:], local["environment"])
    async with Client(params) as client:
        assert "1: alpha" in await read_notes(client)


async def test_the_claude_code_config(plane: Plane, session_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    servers = documented("mcpServers", plane, session_id)["mcpServers"]
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    stdio = servers["sandbox"]
    assert stdio["type"] == "stdio"
    async with Client(stdio_params(stdio["command"], stdio["args"], stdio["env"])) as client:
        assert "1: alpha" in await read_notes(client)
    http = servers["sandbox-http"]
    assert http["type"] == "http"
    async with httpx2.AsyncClient(headers=http["headers"], timeout=30) as transport, \
            Client(streamable_http_client(http["url"], http_client=transport)) as client:
        assert "1: alpha" in await read_notes(client)


async def parked(plane: Plane, session_id: str) -> tuple[str, Any]:
    """Starts a 2026-protocol call of `read .env` and returns its InputRequiredResult's state (and the client's
    context to close)."""
    async def never(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("driven by hand")

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TENANTS[0]['token']}"}, timeout=30)
    url = f"http://{plane.plane.mcp_http.address}/mcp/{session_id}"
    client = Client(streamable_http_client(url, http_client=http), mode="2026-07-28", elicitation_callback=never)
    await client.__aenter__()
    first = await client.session.call_tool("read", {"filePath": ".env"}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult)
    assert first.request_state
    return first.request_state, (client, http)


async def test_another_credential_cannot_answer_a_parked_ask(plane: Plane, session_id: str) -> None:
    state, (owner, owner_http) = await parked(plane, session_id)
    try:
        async with AsyncClient(plane.plane.address, TENANTS[1]["token"]) as intruder_api:
            theirs = await intruder_api.create_session()
        url = f"http://{plane.plane.mcp_http.address}/mcp/{theirs.id}"
        answer: types.InputResponses = {bridge.PERMISSION_KEY: types.ElicitResult(action="accept", content={})}
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TENANTS[1]['token']}"}, timeout=30) as http, \
                Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as intruder:
            with pytest.raises(MCPError, match="unknown or expired request state"):
                await intruder.session.call_tool("read", {"filePath": ".env"}, input_responses=answer,
                                                 request_state=state, allow_input_required=True)
        # The owner still can.
        done = await owner.session.call_tool("read", {"filePath": ".env"}, input_responses=answer,
                                             request_state=state, allow_input_required=True)
        assert isinstance(done, types.CallToolResult)
        assert not done.is_error
        assert "SECRET=1" in done.content[0].text  # type: ignore[union-attr]
    finally:
        await owner.__aexit__(None, None, None)
        await owner_http.aclose()


async def test_a_parked_ask_never_answered_is_aborted(plane: Plane, session_id: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bridge, "PARKED_TTL_S", 0.5)
    state, (owner, owner_http) = await parked(plane, session_id)
    try:
        async with AsyncClient(plane.plane.address, TENANTS[0]["token"]) as api:
            assert len(await api.pending_permissions(session_id)) == 1
            await asyncio.sleep(1.5)
            assert await api.pending_permissions(session_id) == []
        answer: types.InputResponses = {bridge.PERMISSION_KEY: types.ElicitResult(action="accept", content={})}
        with pytest.raises(MCPError, match="unknown or expired request state"):
            await owner.session.call_tool("read", {"filePath": ".env"}, input_responses=answer, request_state=state,
                                          allow_input_required=True)
    finally:
        await owner.__aexit__(None, None, None)
        await owner_http.aclose()
