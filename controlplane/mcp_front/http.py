"""The MCP front end over streamable HTTP, served by the control plane at `server.mcp_listen`.

One endpoint per session, `/mcp/SESSION_ID`, with the tenant's bearer token. Every HTTP request is
authenticated by the gRPC API itself (GetSession with that token): no token or a bad one is 401, another
tenant's session (or none) is 404, exactly as the API answers NOT_FOUND. An MCP session is bound to the
credential and the platform session that opened it, so neither another token nor another path can ride it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Receive, Scope, Send

from controlplane.client import AsyncClient
from controlplane.errors import ConfigError
from controlplane.mcp_front.bridge import SessionTools, owner_key

log = logging.getLogger(__name__)
PATH = re.compile(r"^/mcp/(ses_[A-Za-z0-9_-]{1,100})/?$")
SCOPE_KEY = "ocsb.mcp"
MAX_CLIENTS = 256
MAX_SESSIONS_PER_TOKEN = 32
"""Open MCP sessions one token may hold: the SDK's manager caps them all together, which one tenant alone must
not be able to reach (every other tenant's clients would be refused)."""
"""gRPC clients kept, one per token that passed authentication (a new channel per request costs a connection)."""


class McpHttpApp:
    """The ASGI app: authenticates, then hands the request to the SDK's session manager."""

    def __init__(self, grpc_target: str) -> None:
        self._grpc_target = grpc_target
        self._clients: OrderedDict[str, AsyncClient] = OrderedDict()
        self._retired: list[AsyncClient] = []
        self.tools = SessionTools(self._target_of)
        # DNS-rebinding protection is the SDK's default only for loopback names; a bearer token is required
        # on every request here, which a browser tricked into calling us does not have.
        self.manager = StreamableHTTPSessionManager(
            self.tools.server, security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

    async def _target_of(self, ctx: ServerRequestContext[Any, Any]) -> tuple[AsyncClient, str, str]:
        request = ctx.request
        found = getattr(request, "scope", {}).get(SCOPE_KEY)
        if found is None:  # never: every request passed __call__
            raise RuntimeError("an MCP request reached the tools without its authenticated session")
        token, session_id = found
        return self._client(token), session_id, owner_key(token, session_id)

    def _client(self, token: str) -> AsyncClient:
        key = _key(token)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = AsyncClient(self._grpc_target, token)
            if len(self._clients) > MAX_CLIENTS:
                # Closed at stop, not now: a call of that token may still be running on it.
                self._retired.append(self._clients.popitem(last=False)[1])
        self._clients.move_to_end(key)
        return client

    async def close(self) -> None:
        await self.tools.close()
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        matched = PATH.match(scope["path"])
        if matched is None:
            await _respond(send, 404, "no such endpoint: use /mcp/SESSION_ID")
            return
        session_id = matched.group(1)
        token = _bearer(scope)
        if not token:
            await _respond(send, 401, "a bearer token is required (Authorization: Bearer TOKEN)")
            return
        # Every request is authenticated by the API; a token gets its kept client only once it has passed.
        kept = self._clients.get(_key(token))
        probe = kept or AsyncClient(self._grpc_target, token)
        try:
            await probe.get_session(session_id)
        except grpc.aio.AioRpcError as exc:
            status = {grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.NOT_FOUND: 404,
                      grpc.StatusCode.PERMISSION_DENIED: 403}.get(exc.code(), 502)
            await _respond(send, status, f"{exc.code().name}: {exc.details()}")
            return
        finally:
            if kept is None:
                await probe.close()
        opening = not any(name == b"mcp-session-id" for name, _ in scope.get("headers", []))
        if opening and self._open_sessions(token) >= MAX_SESSIONS_PER_TOKEN:
            await _respond(send, 429, f"this token holds {MAX_SESSIONS_PER_TOKEN} open MCP sessions: close one "
                                      "(HTTP DELETE with its Mcp-Session-Id) or wait for one to idle out")
            return
        scope[SCOPE_KEY] = (token, session_id)
        # The SDK binds an MCP session to the identity that opened it: the token and the platform session.
        identity = f"{_key(token)}/{session_id}"
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=identity, scopes=[]))
        await self.manager.handle_request(scope, receive, send)

    def _open_sessions(self, token: str) -> int:
        # The manager's own record of who opened each live session (it forgets them as they end).
        prefix = _key(token) + "/"
        owners = self.manager._session_owners  # private: the SDK keeps no public count per identity
        return sum(1 for owner in owners.values() if owner["client_id"].startswith(prefix))


def _key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _bearer(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


async def _respond(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="controlplane"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class McpHttpServer:
    address: str
    """host:port it listens on (the port resolved when 0 was asked)."""
    _task: asyncio.Task[None]
    _server: Any
    _app: McpHttpApp

    async def stop(self) -> None:
        """Bounded: a client that stopped reading (its transport's writes blocked) must not keep the control
        plane from the rest of its stop, which removes the sandboxes (a red-team finding: a stalled MCP
        client made the stop raise and leave the warm pool behind)."""
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
                await asyncio.wait_for(self._task, 2)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._app.close(), 5)


async def start(listen: str, grpc_target: str) -> McpHttpServer:
    """Serves on `listen` (host:port, port 0 picks one) until `stop()`."""
    import uvicorn

    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"server.mcp_listen {listen!r}: expected host:port, e.g. 127.0.0.1:50062")
    # Bound here, not by uvicorn: a taken port is a clear error now (uvicorn would exit the process).
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: a response written in pieces (SSE) is not held back for an ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"server.mcp_listen {listen}: {exc.strerror}") from exc
    sock.listen(128)
    sock.setblocking(False)
    app = McpHttpApp(grpc_target)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    async def run() -> None:
        async with _manager(app):
            await server.serve(sockets=[sock])

    task = asyncio.ensure_future(run())
    return McpHttpServer(f"{host}:{sock.getsockname()[1]}", task, server, app)


@contextlib.asynccontextmanager
async def _manager(app: McpHttpApp) -> AsyncIterator[None]:
    async with app.manager.run():
        yield
