"""Spans recorded inside the sandbox and sent back to the control plane as SpanRecord messages.

The sandbox has no network and no OpenTelemetry SDK: only a request whose metadata carries a sampled
W3C `traceparent` gets a Recorder, and everything without one records nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sandbox.v1 import agent_pb2

PROCESS_AGENT = "sandbox-agent"
HOST_PROCESSES = {"bun": "bun-host", "python": "python-host"}
MAX_SPANS = 512
"""Per request: a tool host (running untrusted tool code) cannot flood the exporter."""
MAX_ATTRIBUTES = 32
MAX_EVENTS = 16
MAX_TEXT = 1024
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$")
_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_STATUS = {"ok": agent_pb2.SPAN_STATUS_OK, "error": agent_pb2.SPAN_STATUS_ERROR}

AttributeValue = str | bool | int | float


@dataclass(frozen=True)
class TraceParent:
    trace_id: bytes
    span_id: bytes


def parse_traceparent(value: str) -> TraceParent | None:
    """The parent of a sampled W3C traceparent; None when absent, malformed, invalid or not sampled."""
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None or match[1] == "ff" or (match[1] == "00" and len(value.strip()) != 55):
        return None
    trace_id, span_id, flags = bytes.fromhex(match[2]), bytes.fromhex(match[3]), int(match[4], 16)
    if not flags & 1 or not any(trace_id) or not any(span_id):
        return None
    return TraceParent(trace_id, span_id)


def recorder_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Recorder | None:
    for key, value in metadata or ():
        if key == "traceparent" and isinstance(value, str):
            parent = parse_traceparent(value)
            return Recorder(parent) if parent is not None else None
    return None


def _new_span_id() -> bytes:
    while not any(span_id := os.urandom(8)):
        pass
    return span_id


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT]


def _attribute(key: str, value: object) -> agent_pb2.SpanAttribute | None:
    key = _clip(key)
    if isinstance(value, bool):
        return agent_pb2.SpanAttribute(key=key, bool_value=value)
    if isinstance(value, int):
        if -(1 << 63) <= value < 1 << 63:
            return agent_pb2.SpanAttribute(key=key, int_value=value)
        return agent_pb2.SpanAttribute(key=key, double_value=float(value))
    if isinstance(value, float):
        return agent_pb2.SpanAttribute(key=key, double_value=value)
    if isinstance(value, str):
        return agent_pb2.SpanAttribute(key=key, string_value=_clip(value))
    return None


def _attributes(values: object) -> list[agent_pb2.SpanAttribute]:
    if not isinstance(values, Mapping):
        return []
    return [a for k, v in list(values.items())[:MAX_ATTRIBUTES] if (a := _attribute(str(k), v)) is not None]


class Span:
    """One span in the making; `end()` hands it to its recorder."""

    __slots__ = ("attributes", "end_ns", "events", "name", "parent_id", "recorder", "span_id", "start_ns",
                 "status", "status_message")

    def __init__(self, recorder: Recorder, name: str, parent_id: bytes, attributes: Mapping[str, AttributeValue]
                 ) -> None:
        self.recorder = recorder
        self.name = name
        self.span_id = _new_span_id()
        self.parent_id = parent_id
        self.start_ns = time.time_ns()
        self.end_ns = 0
        self.attributes: dict[str, AttributeValue] = dict(attributes)
        self.events: list[agent_pb2.SpanEvent] = []
        self.status = agent_pb2.SPAN_STATUS_UNSET
        self.status_message = ""

    @property
    def trace_id(self) -> bytes:
        return self.recorder.trace_id

    def set(self, key: str, value: AttributeValue) -> None:
        self.attributes[key] = value

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        if len(self.events) < MAX_EVENTS:
            self.events.append(agent_pb2.SpanEvent(
                name=_clip(name), time_unix_nano=time.time_ns(), attributes=_attributes(attributes or {}),
            ))

    def fail(self, message: str) -> None:
        self.status = agent_pb2.SPAN_STATUS_ERROR
        self.status_message = _clip(message)

    def end(self) -> None:
        if self.end_ns:
            return
        self.end_ns = time.time_ns()
        self.recorder.add(agent_pb2.SpanRecord(
            trace_id=self.trace_id, span_id=self.span_id, parent_span_id=self.parent_id, name=_clip(self.name),
            start_unix_nano=self.start_ns, end_unix_nano=self.end_ns, attributes=_attributes(self.attributes),
            status_code=self.status, status_message=self.status_message, events=self.events,
            process=PROCESS_AGENT,
        ))


class Recorder:
    """The finished spans of one request, all in the trace its traceparent named."""

    def __init__(self, parent: TraceParent) -> None:
        self.trace_id = parent.trace_id
        self.parent_id = parent.span_id
        self._records: list[agent_pb2.SpanRecord] = []

    def start(self, name: str, attributes: Mapping[str, AttributeValue] | None = None,
              parent: Span | None = None) -> Span:
        return Span(self, name, parent.span_id if parent is not None else self.parent_id, attributes or {})

    def add(self, record: agent_pb2.SpanRecord) -> None:
        if len(self._records) < MAX_SPANS:
            self._records.append(record)

    def adopt(self, host_spans: object, process: str) -> None:
        """Takes a tool host's spans (JSON objects); anything outside this trace or malformed is dropped."""
        if not isinstance(host_spans, list):
            return
        for item in host_spans:
            record = _host_record(item, self.trace_id, process)
            if record is not None:
                self.add(record)

    def drain(self) -> list[agent_pb2.SpanRecord]:
        records, self._records = self._records, []
        return records


def _host_record(item: object, trace_id: bytes, process: str) -> agent_pb2.SpanRecord | None:
    if not isinstance(item, dict) or item.get("trace_id") != trace_id.hex():
        return None
    span_id, parent_id = item.get("span_id"), item.get("parent_id")
    start, end = item.get("start_ms"), item.get("end_ms")
    if not (isinstance(span_id, str) and _HEX16.match(span_id) and isinstance(parent_id, str)
            and _HEX16.match(parent_id) and _is_number(start) and _is_number(end)):
        return None
    events = []
    for event in (item.get("events") or [])[:MAX_EVENTS] if isinstance(item.get("events"), list) else []:
        if isinstance(event, dict) and _is_number(event.get("time_ms")):
            events.append(agent_pb2.SpanEvent(
                name=_clip(str(event.get("name", ""))), time_unix_nano=_ms_to_ns(event["time_ms"]),
                attributes=_attributes(event.get("attributes")),
            ))
    return agent_pb2.SpanRecord(
        trace_id=trace_id, span_id=bytes.fromhex(span_id), parent_span_id=bytes.fromhex(parent_id),
        name=_clip(str(item.get("name", ""))), start_unix_nano=_ms_to_ns(start), end_unix_nano=_ms_to_ns(end),
        attributes=_attributes(item.get("attributes")),
        status_code=_STATUS.get(str(item.get("status", "")), agent_pb2.SPAN_STATUS_UNSET),
        status_message=_clip(str(item.get("message", ""))), events=events, process=process,
    )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e14


def _ms_to_ns(value: Any) -> int:
    return round(float(value) * 1_000_000)


# -- the span a request is in now, for code that is not handed the recorder (the tool host driver) --

_current: ContextVar[Span | None] = ContextVar("sandbox_agent_span", default=None)


@contextlib.contextmanager
def span(recorder: Recorder | None, name: str, attributes: Mapping[str, AttributeValue] | None = None
         ) -> Iterator[Span | None]:
    """A span around a block (nothing at all without a recorder); an exception escaping marks it failed."""
    if recorder is None:
        yield None
        return
    current = _current.get()
    opened = recorder.start(name, attributes, current if current is not None and current.trace_id ==
                            recorder.trace_id else None)
    token = _current.set(opened)
    try:
        yield opened
    except BaseException as exc:
        opened.fail(str(exc) or type(exc).__name__)
        raise
    finally:
        try:
            _current.reset(token)
        except ValueError:
            # A call's coroutine that the garbage collector closes (its loop is gone) runs this in whatever
            # context is current then, where the token is not valid: there is nothing of its own to restore.
            pass
        opened.end()


def child(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> contextlib.AbstractContextManager[
        Span | None]:
    """A span under the current one, for code that is not handed the recorder; nothing outside a trace."""
    current = _current.get()
    return span(current.recorder if current is not None else None, name, attributes)


def detach() -> None:
    """Leaves the current trace for the rest of this task: background work must not add spans to a finished one."""
    _current.set(None)


def host_trace() -> dict[str, str] | None:
    """The trace fields a tool host request carries: its spans become children of the current span."""
    current = _current.get()
    if current is None:
        return None
    return {"trace_id": current.trace_id.hex(), "parent_id": current.span_id.hex()}


def adopt_host_spans(message: Mapping[str, Any], host_name: str) -> None:
    """Keeps the spans a tool host returned with its reply, in the current span's recorder."""
    spans = message.get("spans")
    current = _current.get()
    if spans and current is not None:
        current.recorder.adopt(spans, HOST_PROCESSES.get(host_name, f"{host_name}-host"))
