"""MCP servers of a session (official SDK): config parsing, connections, and their tools as registry entries."""

from controlplane.mcp.config import LocalServer, McpConfig, McpConfigError, RemoteServer, parse_entry, parse_mcp_config
from controlplane.mcp.servers import McpCallError, McpServers, ServerStatus
from controlplane.mcp.tools import forced_schema, mcp_tool_infos, sanitize, to_tool_result, tool_id

__all__ = [
    "LocalServer",
    "McpCallError",
    "McpConfig",
    "McpConfigError",
    "McpServers",
    "RemoteServer",
    "ServerStatus",
    "forced_schema",
    "mcp_tool_infos",
    "parse_entry",
    "parse_mcp_config",
    "sanitize",
    "to_tool_result",
    "tool_id",
]
