"""What custom tools and plugins print (console.* in Bun, print and logging in Python), as log lines for their
authors, within bounds the tool code cannot move.

The hosts tag each line with the file it comes from and the request it ran in, and cut it already; the agent
checks again (a host runs tool code and may be lied to): a line is cut at MAX_LINE_BYTES, a call forwards at
most CALL_LOG_BYTES of lines (then one line saying how many were dropped), and a listing at most
LOAD_LOG_LINES lines. A tool printing in a loop costs the agent a JSON parse per line and nothing more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

MAX_LINE_BYTES = 8 * 1024
CALL_LOG_BYTES = 128 * 1024
"""Twice the hosts' own budget (64 Ki characters of text a call), so an honest host's lines and its line
saying what it dropped pass; a host sending more (or many empty lines) meets this one."""
LINE_OVERHEAD = 16
LOAD_LOG_LINES = 500
LEVELS = frozenset({"debug", "info", "warn", "error"})


@dataclass(frozen=True)
class LogLine:
    origin: str
    level: str
    text: str
    at: float
    """Unix time, seconds."""

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8", "surrogatepass")) + LINE_OVERHEAD


def cut(text: str, limit: int = MAX_LINE_BYTES) -> str:
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"… [{len(data) - limit} bytes cut]"


def line_from(message: dict[str, Any]) -> LogLine:
    """A host's `log` message as a line, whatever the host put in its fields."""
    level = message.get("level")
    at = message.get("at")
    return LogLine(
        origin=cut(str(message.get("origin") or ""), 1024),
        level=level if isinstance(level, str) and level in LEVELS else "info",
        text=cut(str(message.get("text") or "")),
        at=at / 1000 if isinstance(at, int | float) and not isinstance(at, bool) and at > 0 else time.time(),
    )


def load_lines(items: object) -> list[LogLine]:
    """The load-time lines of a host's `loaded` reply, bounded."""
    if not isinstance(items, list):
        return []
    lines = [line_from(item) for item in items[:LOAD_LOG_LINES] if isinstance(item, dict)]
    if len(items) > LOAD_LOG_LINES:
        lines.append(dropped_line("", len(items) - LOAD_LOG_LINES))
    return lines


def dropped_line(origin: str, count: int) -> LogLine:
    return LogLine(origin, "warn", f"[{count} more log lines dropped]", time.time())


class CallLogs:
    """One call's budget: `admit` says whether a line goes out; `close` gives the line telling what did not."""

    def __init__(self, limit: int = CALL_LOG_BYTES) -> None:
        self._left = limit
        self._dropped = 0
        self._origin = ""

    def admit(self, line: LogLine) -> bool:
        self._origin = line.origin
        if line.size > self._left:
            self._dropped += 1
            self._left = 0
            return False
        self._left -= line.size
        return True

    def close(self) -> LogLine | None:
        return dropped_line(self._origin, self._dropped) if self._dropped else None
