"""Remote MCP servers on loopback (uvicorn, official SDK's MCPServer): streamable HTTP, SSE fallback, headers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer

from controlplane.core.calls.tool import InitContext
from controlplane.mcp import McpServers, RemoteServer, ServerStatus, mcp_tool_infos, parse_mcp_config
from controlplane.mcp.servers import OAUTH_UNSUPPORTED
from tests.unit.mcp.test_mcp_stdio import make_context

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_KEY = "s3cret-key"


def make_mcp_server() -> MCPServer:
    server = MCPServer("remote-test")

    @server.tool(description="Adds two numbers")
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Always fails")
    def boom() -> str:
        raise ValueError("kaput")

    return server


class Guarded:
    """Refuses requests without the API key header and records what it was asked."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.requests.append((scope["method"], scope["path"]))
        headers = dict(scope["headers"])
        if headers.get(b"x-api-key") != API_KEY.encode():
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing key"})
            return
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="none", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture(scope="module")
async def streamable() -> AsyncIterator[tuple[str, Guarded]]:
    guarded = Guarded(make_mcp_server().streamable_http_app(host="127.0.0.1"))
    async with serving(guarded) as base:
        yield f"{base}/mcp", guarded


@pytest.fixture(scope="module")
async def sse_only() -> AsyncIterator[tuple[str, Guarded]]:
    guarded = Guarded(make_mcp_server().sse_app(host="127.0.0.1"))
    async with serving(guarded) as base:
        yield f"{base}/sse", guarded


def remote(url: str, **extra: Any) -> RemoteServer:
    return RemoteServer(type="remote", url=url, headers={"X-Api-Key": API_KEY}, **extra)


async def call(mcp: McpServers, tool_id: str, args: dict[str, Any]) -> str:
    info = {i.id: i for i in mcp_tool_infos(mcp)}[tool_id]
    definition = await info.init(InitContext())
    return (await definition.execute(args, make_context([]))).output


async def test_streamable_http_with_headers(streamable: tuple[str, Guarded]) -> None:
    url, guarded = streamable
    guarded.requests.clear()
    mcp = McpServers(None, {"calc": remote(url)})
    try:
        assert await mcp.connect_all() == {"calc": ServerStatus("connected")}
        assert [i.id for i in mcp_tool_infos(mcp)] == ["calc_add", "calc_boom"]
        assert await call(mcp, "calc_add", {"a": 2, "b": 3}) == "5"
        # isError results reach the model as output (upstream never looks at the flag).
        assert await call(mcp, "calc_boom", {}) == "Error executing tool boom"
        assert {path for _, path in guarded.requests} == {"/mcp"}  # no SSE attempt
    finally:
        await mcp.close()
    assert guarded.requests[-1] == ("DELETE", "/mcp")  # the session was ended on close


async def test_sse_fallback(sse_only: tuple[str, Guarded]) -> None:
    url, guarded = sse_only
    guarded.requests.clear()
    mcp = McpServers(None, {"legacy": remote(url)})
    try:
        assert await mcp.connect_all() == {"legacy": ServerStatus("connected")}
        assert guarded.requests[:2] == [("POST", "/sse"), ("GET", "/sse")]  # streamable HTTP first, then SSE
        assert await call(mcp, "legacy_add", {"a": 40, "b": 2}) == "42"
    finally:
        await mcp.close()


async def test_missing_header_fails_without_hurting_others(
    streamable: tuple[str, Guarded], sse_only: tuple[str, Guarded]
) -> None:
    config = parse_mcp_config({"mcp": {
        "nokey": {"type": "remote", "url": streamable[0]},
        "good": {"type": "remote", "url": sse_only[0], "headers": {"X-Api-Key": API_KEY}},
    }})
    mcp = McpServers.from_config(None, config)
    try:
        statuses = await mcp.connect_all()
        assert statuses["good"] == ServerStatus("connected")
        assert statuses["nokey"].status == "failed"
        # Upstream reports the last transport's error: here the SSE attempt's.
        assert statuses["nokey"] == ServerStatus("failed", f"Client error '401 Unauthorized' for url '{streamable[0]}'")
        assert [i.id for i in mcp_tool_infos(mcp)] == ["good_add", "good_boom"]
    finally:
        await mcp.close()


async def test_oauth_is_refused_before_any_request(streamable: tuple[str, Guarded]) -> None:
    url, guarded = streamable
    guarded.requests.clear()
    config = parse_mcp_config({"mcp": {"o": {"type": "remote", "url": url, "oauth": {"clientId": "abc"}}}})
    mcp = McpServers.from_config(None, config)
    assert await mcp.connect_all() == {"o": ServerStatus("failed", OAUTH_UNSUPPORTED)}
    assert guarded.requests == []
    # `oauth: false` is the supported spelling.
    assert await mcp.add("o", remote(url, oauth=False)) == ServerStatus("connected")
    await mcp.close()


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/mcp", "not a url", "http:///nohost", ""])
async def test_invalid_url(url: str) -> None:
    mcp = McpServers(None, {"bad url": remote(url)})
    assert await mcp.connect_all() == {"bad url": ServerStatus("failed", 'Invalid MCP URL for "bad url"')}


async def test_url_guard_refuses_before_any_request(streamable: tuple[str, Guarded]) -> None:
    url, guarded = streamable
    guarded.requests.clear()
    seen: list[str] = []

    async def guard(target: str) -> None:
        seen.append(target)
        raise PermissionError("address 127.0.0.1 is not allowed")

    mcp = McpServers(None, {"g": remote(url)}, url_guard=guard)
    assert await mcp.connect_all() == {"g": ServerStatus("failed", "address 127.0.0.1 is not allowed")}
    assert seen == [url]
    assert guarded.requests == []


async def test_nothing_listening() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # a port nobody listens on
    mcp = McpServers(None, {"gone": remote(f"http://127.0.0.1:{port}/mcp")})
    statuses = await mcp.connect_all()
    assert statuses["gone"].status == "failed"
    assert statuses["gone"].error == "All connection attempts failed"


async def test_connect_timeout_when_the_server_never_answers() -> None:
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accept, read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        mcp = McpServers(None, {"mute": remote(f"http://127.0.0.1:{port}/mcp", timeout=400)})
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await mcp.connect_all() == {"mute": ServerStatus("failed", "Operation timed out after 400ms")}
        assert loop.time() - started < 3  # each transport gets the timeout once, nothing hangs
        await mcp.close()
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
