"""`controlplane mcp SESSION`: the session's tools for an MCP client that started us (stdin/stdout)."""

from __future__ import annotations

import sys
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from controlplane.client import AsyncClient
from controlplane.mcp_front.bridge import SessionTools, owner_key


async def serve_stdio(target: str, token: str, session_id: str) -> int:
    """Serves until the client closes stdin. The session is checked first, so a wrong id or token is one clear
    line on stderr (stdout belongs to the protocol) rather than an error on every request."""
    async with AsyncClient(target, token) as client:
        await client.get_session(session_id)  # NOT_FOUND / UNAUTHENTICATED: reported by the CLI, status 2
        key = owner_key(token, session_id)

        async def target_of(_: ServerRequestContext[Any, Any]) -> tuple[AsyncClient, str, str]:
            return client, session_id, key

        tools = SessionTools(target_of)
        print(f"controlplane: serving the tools of {session_id} over MCP on stdio", file=sys.stderr)
        try:
            async with stdio_server() as (read, write):
                await tools.server.run(read, write, tools.server.create_initialization_options())
        finally:
            await tools.close()
    return 0
