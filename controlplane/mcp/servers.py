"""The MCP servers of one session: connected with the official SDK's ClientSession, listed, called.

`local` servers run inside the session's sandbox (stdio over the agent's exec); `remote` servers
are reached from the control plane, streamable HTTP first, then SSE. A server that cannot be
reached is `failed` with a message and never takes the others down; only `connected` servers
contribute tools.

Deliberate differences from v1.2.27: an abort cancels the MCP request (`notifications/cancelled`)
instead of leaving it running; the tool list is read once per connection (all pages) rather than
on every listing; a local server whose process exits becomes `failed`; servers are listed in config
order, not connection order; OAuth is refused with a clear status instead of being attempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx2
import mcp_types
from mcp import ClientSession
from mcp.client._transport import TransportStreams
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from controlplane.core.calls.tool import ToolError
from controlplane.core.seam.messages import CommandSpec, Exited
from controlplane.core.seam.provider import SandboxAgent
from controlplane.errors import ControlPlaneError
from controlplane.mcp.config import (
    LocalServer,
    McpConfig,
    OAuthSettings,
    RemoteServer,
    call_timeout_ms,
    connect_timeout_ms,
)
from controlplane.mcp.exec_transport import exec_transport
from controlplane.telemetry import spans

log = logging.getLogger("controlplane.mcp")

CLIENT_INFO = mcp_types.Implementation(name="opencode", version="1.2.27")
"""Servers that adapt to their client see the client they were written for."""
ABORTED = "Tool execution aborted"
OAUTH_UNSUPPORTED = (
    "OAuth is not supported for remote MCP servers on this platform: "
    'set "oauth": false and pass credentials in "headers"'
)
CLOSE_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0

Entry = LocalServer | RemoteServer
UrlGuard = Callable[[str], Awaitable[None]]
"""Refuses (raises with a message) a remote URL the control plane must not reach."""
Opener = Callable[[], AbstractAsyncContextManager[TransportStreams]]


@dataclass(frozen=True)
class ServerStatus:
    status: Literal["connected", "failed", "disabled"]
    error: str = ""


DISABLED = ServerStatus("disabled")
CONNECTED = ServerStatus("connected")
NOT_CONNECTED = ServerStatus("failed", "not connected yet")


class McpCallError(ToolError):
    """A tool call that did not produce a result; `str()` is what the model reads."""


class _Connection:
    """One ClientSession, owned by a task of its own (the SDK's task groups must exit where they began)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.session: ClientSession | None = None
        self.tools: list[mcp_types.Tool] = []
        self.lost = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, opener: Opener, timeout_s: float) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._own(opener, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout_s)
        except BaseException:
            await _finish(task)
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved here, so the loop does not report it as lost
            raise
        self._task = task

    async def _own(self, opener: Opener, ready: asyncio.Future[None]) -> None:
        try:
            async with opener() as (read, write), ClientSession(
                read, write, client_info=CLIENT_INFO, logging_callback=self._server_log
            ) as session:
                await session.initialize()
                self.session = session
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done() and isinstance(exc, Exception):
                ready.set_exception(_leaf(exc))
            elif not ready.done():
                ready.cancel()
            elif isinstance(exc, Exception):
                log.warning("mcp %s: connection ended: %s", self.name, _message(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            self.session = None

    async def _server_log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        log.info("mcp %s log (%s): %s", self.name, params.level, params.data)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_TIMEOUT_S)
            await _finish(self._task)


class McpServers:
    """The MCP servers of one session. Not thread-safe; use from the control plane's event loop."""

    def __init__(
        self,
        agent: SandboxAgent | None,
        servers: Mapping[str, Entry],
        *,
        call_timeout_default_ms: int | None = None,
        cwd: str = "",
        url_guard: UrlGuard | None = None,
    ) -> None:
        """`cwd` is where local servers start ("" is the sandbox workspace); `call_timeout_default_ms`
        is `experimental.mcp_timeout`."""
        self._agent = agent
        self._entries: dict[str, Entry] = dict(servers)
        self._call_default_ms = call_timeout_default_ms
        self._cwd = cwd
        self._url_guard = url_guard
        self._status: dict[str, ServerStatus] = {name: NOT_CONNECTED for name in self._entries}
        self._connections: dict[str, _Connection] = {}
        self._closed = False

    @classmethod
    def from_config(cls, agent: SandboxAgent | None, config: McpConfig, **options: Any) -> McpServers:
        return cls(agent, config.servers, call_timeout_default_ms=config.call_timeout_ms, **options)

    async def connect_all(self) -> dict[str, ServerStatus]:
        """Connects every enabled server concurrently; returns each server's status."""
        await asyncio.gather(*(self._traced_connect(name) for name in list(self._entries)))
        return self.statuses()

    async def add(self, name: str, entry: Entry) -> ServerStatus:
        """Connects (or replaces) one server mid-session."""
        old = self._connections.pop(name, None)
        if old is not None:
            await old.close()
        self._entries[name] = entry
        self._status[name] = NOT_CONNECTED
        await self._traced_connect(name)
        return self._status[name]

    def statuses(self) -> dict[str, ServerStatus]:
        return {name: self._status[name] for name in self._entries}

    def tools(self) -> list[tuple[str, mcp_types.Tool]]:
        """(server, tool) for every tool of every connected server, servers in config order."""
        listed: list[tuple[str, mcp_types.Tool]] = []
        for name in self._entries:
            connection = self._connections.get(name)
            if connection is not None and self._status[name].status == "connected":
                listed.extend((name, tool) for tool in connection.tools)
        return listed

    def call_timeout_s(self, server: str) -> float:
        entry = self._entries.get(server)
        default = self._call_default_ms
        return (call_timeout_ms(entry, default) if entry is not None else default or 60_000) / 1000

    async def call(
        self, server: str, tool: str, args: dict[str, Any], abort: asyncio.Event, timeout_s: float | None = None
    ) -> mcp_types.CallToolResult:
        """Calls a tool; the timeout (default: the server's) restarts whenever the server reports progress.

        Raises McpCallError with the text the model reads (upstream's `MCP error {code}: {message}`
        wording), or `Tool execution aborted` once `abort` is set.
        """
        connection = self._connections.get(server)
        session = connection.session if connection is not None else None
        if session is None or self._status.get(server) != CONNECTED:
            raise McpCallError(f"MCP server {server} is not connected")
        limit = timeout_s if timeout_s is not None else self.call_timeout_s(server)
        last_sign_of_life = time.monotonic()

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            nonlocal last_sign_of_life
            last_sign_of_life = time.monotonic()

        request = asyncio.ensure_future(session.call_tool(tool, args, progress_callback=progressed))
        aborted = asyncio.ensure_future(abort.wait())
        try:
            while not request.done():
                remaining = last_sign_of_life + limit - time.monotonic()
                if remaining <= 0:
                    raise McpCallError(f"MCP error {mcp_types.REQUEST_TIMEOUT}: Request timed out")
                await asyncio.wait({request, aborted}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if aborted.done() and not request.done():
                    raise McpCallError(ABORTED)
            return _call_result(request)
        finally:
            aborted.cancel()
            await _finish(request)

    async def close(self) -> None:
        """Ends local server processes and remote connections; the object is unusable afterwards."""
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections))

    # -- connecting ------------------------------------------------------------------------------

    async def _traced_connect(self, name: str) -> None:
        with spans.mcp_listing(name) as listing:
            await self._connect(name)
            status, connection = self._status.get(name), self._connections.get(name)
            listing.finished(status.error if status is not None and status.status == "failed" else "",
                             len(connection.tools) if connection is not None else 0)

    async def _connect(self, name: str) -> None:
        entry = self._entries[name]
        if not entry.enabled:
            self._status[name] = DISABLED
            return
        connection = _Connection(name)
        timeout_ms = connect_timeout_ms(entry)
        try:
            if isinstance(entry, LocalServer):
                await self._open_local(connection, entry, timeout_ms)
            else:
                await self._open_remote(connection, entry, timeout_ms)
        except _RefusedError as exc:
            self._fail(name, str(exc))
            return
        except Exception as exc:
            self._fail(name, _message(exc, timeout_ms))
            return
        try:
            connection.tools = await asyncio.wait_for(_list_all_tools(connection), timeout_ms / 1000)
        except Exception as exc:
            log.warning("mcp %s: listing tools failed: %s", name, _message(exc, timeout_ms))
            await connection.close()
            self._fail(name, "Failed to get tools")
            return
        if self._closed or self._entries.get(name) is not entry:
            await connection.close()  # closed or replaced while connecting
            return
        self._connections[name] = connection
        self._status[name] = CONNECTED if not connection.lost else ServerStatus("failed", "MCP server exited")

    def _fail(self, name: str, message: str) -> None:
        log.warning("mcp %s failed: %s", name, message)
        self._status[name] = ServerStatus("failed", message)

    async def _open_local(self, connection: _Connection, entry: LocalServer, timeout_ms: int) -> None:
        agent = self._agent
        if agent is None:
            raise _RefusedError("this session has no sandbox to run local MCP servers in")
        spec = CommandSpec(argv=list(entry.command), env=dict(entry.environment), cwd=self._cwd, stdin=True,
                           server=True)

        def exited(status: Exited | None) -> None:
            connection.lost = True
            if self._connections.get(connection.name) is connection:
                code = "sandbox lost" if status is None else f"exit code {status.exit_code}"
                self._fail(connection.name, f"MCP server exited ({code})")

        await connection.open(lambda: exec_transport(agent, spec, label=connection.name, on_exit=exited),
                              timeout_ms / 1000)

    async def _open_remote(self, connection: _Connection, entry: RemoteServer, timeout_ms: int) -> None:
        if isinstance(entry.oauth, OAuthSettings):
            raise _RefusedError(OAUTH_UNSUPPORTED)
        parts = urlsplit(entry.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _RefusedError(f'Invalid MCP URL for "{connection.name}"')
        if self._url_guard is not None:
            try:
                await self._url_guard(entry.url)
            except Exception as exc:
                raise _RefusedError(str(exc)) from exc
        headers = dict(entry.headers)
        errors: list[BaseException] = []
        for label, opener in (("streamable HTTP", _streamable(entry.url, headers)), ("SSE", _sse(entry.url, headers))):
            try:
                await connection.open(opener, timeout_ms / 1000)
            except Exception as exc:
                log.info("mcp %s: %s connection failed: %s", connection.name, label, _message(exc, timeout_ms))
                errors.append(exc)
                continue
            return
        raise errors[-1]


class _RefusedError(ControlPlaneError):
    """A server this platform will not connect to; the message is its status."""


def _streamable(url: str, headers: dict[str, str]) -> Opener:
    @asynccontextmanager
    async def opener() -> AsyncIterator[TransportStreams]:
        async with AsyncExitStack() as stack:
            # The SDK's own defaults: a server may hold a response stream open for minutes.
            timeout = httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S)
            client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=timeout))
            yield await stack.enter_async_context(streamable_http_client(url, http_client=client))

    return opener


def _sse(url: str, headers: dict[str, str]) -> Opener:
    @asynccontextmanager
    async def opener() -> AsyncIterator[TransportStreams]:
        async with sse_client(url, headers=headers) as streams:
            yield streams

    return opener


async def _list_all_tools(connection: _Connection) -> list[mcp_types.Tool]:
    session = connection.session
    if session is None:
        raise MCPError(mcp_types.CONNECTION_CLOSED, "Connection closed")
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _call_result(request: asyncio.Future[Any]) -> mcp_types.CallToolResult:
    try:
        result = request.result()
    except MCPError as exc:
        raise McpCallError(f"MCP error {exc.code}: {exc.message}") from exc
    except Exception as exc:
        raise McpCallError(_message(exc)) from exc
    if not isinstance(result, mcp_types.CallToolResult):
        raise McpCallError(f"unexpected result from the MCP server: {type(result).__name__}")
    return result


async def _finish(task: asyncio.Future[Any]) -> None:
    """Cancels the task if it still runs and waits until it is over, whatever it raised."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _message(exc: BaseException, timeout_ms: int | None = None) -> str:
    exc = _leaf(exc)
    if isinstance(exc, TimeoutError) and timeout_ms is not None:
        return f"Operation timed out after {timeout_ms}ms"
    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return str(exc).split("\n", 1)[0]  # without the documentation link httpx appends
    return str(exc) or type(exc).__name__
