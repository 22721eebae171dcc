"""What Python tools print (print, sys.stdout/stderr, logging) becomes log lines an author can read.

Each line is tagged with the tool file it comes from, through a context variable set around a file's import
(its lines are kept and sent with the load's reply) and around a call (its lines are sent tagged with the
call's request, before its reply, within a budget). Output outside those scopes (the host's own) goes to
stderr as before. Lines are cut here too, so a tool printing in a loop costs the host little.
"""

from __future__ import annotations

import contextvars
import io
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_LINE_CHARS = 8192
MAX_SINK_LINES = 50
MAX_SINK_CHARS = 16 * 1024
MAX_CALL_CHARS = 64 * 1024
Message = dict[str, Any]


@dataclass
class Scope:
    request: str
    origin: str
    sink: list[Message] | None = None
    """A file's load-time lines, kept for the load's reply; None for a call, whose lines are sent."""
    chars: int = 0
    dropped: int = 0
    partial: dict[str, Pending] = field(default_factory=dict)
    """Text written to a stream since its last newline, by level."""


@dataclass
class Pending:
    """The unfinished line of one stream, as the pieces written, never longer than MAX_LINE_CHARS: a tool
    writing one character at a time, or 50 MiB with no newline, costs a constant amount per character."""

    pieces: list[str] = field(default_factory=list)
    size: int = 0

    def add(self, piece: str) -> None:
        self.pieces.append(piece)
        self.size += len(piece)

    def take(self) -> str:
        text = "".join(self.pieces)
        self.pieces.clear()
        self.size = 0
        return text


SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("pyhost_log_scope", default=None)
_send: Callable[[Message], None] | None = None


def _line(scope: Scope, level: str, text: str) -> Message:
    if len(text) > MAX_LINE_CHARS:
        text = f"{text[:MAX_LINE_CHARS]}… [{len(text) - MAX_LINE_CHARS} characters cut]"
    return {"origin": scope.origin, "level": level, "text": text, "at": time.time() * 1000}


def emit(scope: Scope, level: str, text: str) -> None:
    line = _line(scope, level, text)
    size = len(line["text"])
    if scope.sink is not None:
        if len(scope.sink) >= MAX_SINK_LINES or scope.chars + size > MAX_SINK_CHARS:
            scope.dropped += 1
            return
        scope.chars += size
        scope.sink.append(line)
        return
    if scope.chars + size > MAX_CALL_CHARS:
        scope.dropped += 1
        return
    scope.chars += size
    if _send is not None:
        _send({"id": scope.request, "type": "log", **line})


def finish(scope: Scope) -> list[Message]:
    """Ends a scope: its unfinished lines go out, and a last line tells how many were dropped. Returns the
    load-time lines of a file's scope."""
    for level, pending in list(scope.partial.items()):
        if pending.size:
            emit(scope, level, pending.take())
    scope.partial.clear()
    if scope.dropped:
        told = {**_line(scope, "warn", f"[{scope.dropped} more log lines dropped]")}
        if scope.sink is not None:
            scope.sink.append(told)
        elif _send is not None:
            _send({"id": scope.request, "type": "log", **told})
        scope.dropped = 0
    return scope.sink or []


class _Stream(io.TextIOBase):
    """sys.stdout or sys.stderr: inside a scope a line becomes a log line, outside it goes to `fallback`."""

    def __init__(self, level: str, fallback: Any) -> None:
        self._level = level
        self._fallback = fallback

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        scope = SCOPE.get()
        if scope is None:
            return int(self._fallback.write(text))
        text = str(text)
        pending = scope.partial.setdefault(self._level, Pending())
        # Walked by index: slicing off what was handled would copy the rest each time (quadratic in a long
        # write). A line that never ends is cut into pieces of MAX_LINE_CHARS as it grows; once the call's
        # budget is spent each piece only counts as dropped.
        pos, end = 0, len(text)
        while pos < end:
            newline = text.find("\n", pos)
            stop = end if newline < 0 else newline
            while pos < stop:
                if pending.size >= MAX_LINE_CHARS:
                    emit(scope, self._level, pending.take())
                step = min(stop - pos, MAX_LINE_CHARS - pending.size)
                pending.add(text[pos:pos + step])
                pos += step
            if newline < 0:
                break
            emit(scope, self._level, pending.take())
            pos = newline + 1
        return len(text)

    def flush(self) -> None:
        if SCOPE.get() is None:
            self._fallback.flush()

    def fileno(self) -> int:
        return int(self._fallback.fileno())


class _Handler(logging.Handler):
    LEVELS = ((logging.ERROR, "error"), (logging.WARNING, "warn"), (logging.INFO, "info"))

    def emit(self, record: logging.LogRecord) -> None:
        scope = SCOPE.get()
        if scope is None:
            return
        level = next((name for number, name in self.LEVELS if record.levelno >= number), "debug")
        try:
            emit(scope, level, self.format(record))
        except Exception:  # a record that cannot be formatted is lost, never the call
            return


def capture(send: Callable[[Message], None]) -> None:
    """Routes print, sys.stdout/stderr and logging (at the root logger's level, WARNING unless a tool sets
    another, as in any Python program) through the scopes."""
    global _send
    _send = send
    sys.stdout = _Stream("info", sys.stdout)
    sys.stderr = _Stream("error", sys.stderr)
    logging.getLogger().addHandler(_Handler())
