"""Spans recorded in the Python host for a traced request, returned in the reply's `spans` list.

A request without a valid `trace` field records nothing (the sandbox agent forwards them upstream).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")

Value = str | int | float | bool


def unix_ms(perf_counter: float | None = None) -> float:
    """Unix time in milliseconds; from a perf_counter() reading when given (monotonic intervals)."""
    if perf_counter is None:
        return time.time_ns() / 1e6
    return time.time_ns() / 1e6 - (time.perf_counter() - perf_counter) * 1000


class Span:
    def __init__(self, sink: list[dict[str, Any]], trace_id: str, parent_id: str, name: str,
                 attributes: dict[str, Value], start_ms: float) -> None:
        self._sink = sink
        self._ended = False
        self.json: dict[str, Any] = {
            "trace_id": trace_id, "span_id": _span_id(), "parent_id": parent_id, "name": name,
            "start_ms": start_ms, "end_ms": start_ms, "attributes": dict(attributes), "status": "unset",
            "message": "", "events": [],
        }

    def set(self, key: str, value: Value) -> Span:
        self.json["attributes"][key] = value
        return self

    def event(self, name: str, at_ms: float, attributes: dict[str, Any] | None = None) -> Span:
        self.json["events"].append({"name": name, "time_ms": at_ms, "attributes": attributes or {}})
        return self

    def fail(self, message: str) -> Span:
        self.json["status"], self.json["message"] = "error", message
        return self

    def end(self, at_ms: float | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self.json["end_ms"] = max(unix_ms() if at_ms is None else at_ms, self.json["start_ms"])
        self._sink.append(self.json)


class Recording:
    """The spans of one request; `start` returns None when the request is not traced."""

    def __init__(self, request: dict[str, Any]) -> None:
        trace = request.get("trace")
        self.spans: list[dict[str, Any]] = []
        self._trace: tuple[str, str] | None = None
        if isinstance(trace, dict):
            trace_id, parent_id = trace.get("trace_id"), trace.get("parent_id")
            if isinstance(trace_id, str) and isinstance(parent_id, str) and _HEX32.match(trace_id) \
                    and _HEX16.match(parent_id):
                self._trace = (trace_id, parent_id)

    def start(self, name: str, attributes: dict[str, Value] | None = None, start_ms: float | None = None
              ) -> Span | None:
        if self._trace is None:
            return None
        return Span(self.spans, *self._trace, name, attributes or {}, unix_ms() if start_ms is None else start_ms)

    def field(self) -> dict[str, Any]:
        return {"spans": self.spans} if self.spans else {}


def _span_id() -> str:
    while not any(raw := os.urandom(8)):
        pass
    return raw.hex()
