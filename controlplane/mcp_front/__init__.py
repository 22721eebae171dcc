"""The MCP server front end: a session's tools for MCP clients, over stdio (`controlplane mcp SESSION`) and
streamable HTTP (`server.mcp_listen`)."""
