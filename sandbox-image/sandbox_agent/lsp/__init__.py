"""Language servers for the `lsp` tool: a small LSP client and each session's lazily started servers."""

from sandbox_agent.lsp.servers import close_all, close_session, session_servers

__all__ = ["close_all", "close_session", "session_servers"]
