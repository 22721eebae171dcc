"""A session's MCP servers as the tool runtime sees them: tools to list and run, problems to report."""

from __future__ import annotations

import json

from controlplane import egress
from controlplane.core.calls.tool import ToolInfo
from controlplane.core.calls.tool_runtime import McpFactory
from controlplane.core.seam.provider import SandboxAgent
from controlplane.mcp.config import parse_mcp_config
from controlplane.mcp.servers import McpServers
from controlplane.mcp.tools import mcp_tool_infos


class SessionMcp:
    """Implements `core.calls.runtime_sessions.McpSource` for one session."""

    def __init__(self, servers: McpServers, problems: list[tuple[str, str]]) -> None:
        self._servers = servers
        self._problems = problems

    def tools(self) -> list[ToolInfo]:
        return mcp_tool_infos(self._servers)

    def load_errors(self) -> list[tuple[str, str]]:
        failed = [
            (name, status.error) for name, status in self._servers.statuses().items() if status.status == "failed"
        ]
        return [*self._problems, *failed]

    async def close(self) -> None:
        await self._servers.close()


def mcp_factory(policy: egress.EgressPolicy) -> McpFactory:
    """`ToolRuntime`'s MCP factory: connects a session's configured servers (remote URLs vetted by
    the egress policy, as webfetch's are)."""

    async def guard(url: str) -> None:
        await egress.vet(url, policy)

    async def connect(config_json: str, agent: SandboxAgent) -> SessionMcp | None:
        document = json.loads(config_json) if config_json else {}
        if not isinstance(document, dict) or not document.get("mcp"):
            return None
        config = parse_mcp_config(document)
        servers = McpServers.from_config(agent, config, url_guard=guard)
        await servers.connect_all()
        return SessionMcp(servers, [(p.name, str(p)) for p in config.problems])

    return connect
