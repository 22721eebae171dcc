"""A line a custom tool or plugin printed (console.*, print, logging), for its author.

The sandbox's hosts capture and bound them (sandbox_agent/tool_logs.py); the control plane shows them to the
API caller (ListTools, the call's stream, the bus, spans) and never to the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolLogged:
    origin: str
    """The file it comes from (workspace path)."""
    level: str
    """debug, info, warn or error."""
    text: str
    at: float
    """Unix time, seconds."""
    call_id: str = ""
    """The call it was printed in; empty at load time."""

    def properties(self) -> dict[str, object]:
        """Its bus event's properties (`tool.log`)."""
        return {"callID": self.call_id, "origin": self.origin, "level": self.level, "text": self.text, "time": self.at}
