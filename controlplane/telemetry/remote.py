"""Spans recorded inside a sandbox (agent, Bun and Python hosts), re-emitted through this process's exporter.

The sandbox has no network: its spans come back as SpanRecords in agent responses. They are untrusted
(the sandbox runs model-chosen code), so only records of the call's own trace are kept, capped in number,
re-parented under the call when their parent is unknown, and shifted into the call's interval so that a
skewed sandbox clock cannot put a child outside its parent.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from controlplane.telemetry.attributes import SANDBOX_ID, SANDBOX_PROCESS, TRACER_NAME
from sandbox.v1 import agent_pb2

MAX_REMOTE_SPANS = 1024
"""Per agent call; more than that from one call is a sandbox misbehaving, not telemetry."""
SCOPE = InstrumentationScope(f"{TRACER_NAME}.sandbox")
_STATUS = {agent_pb2.SPAN_STATUS_OK: StatusCode.OK, agent_pb2.SPAN_STATUS_ERROR: StatusCode.ERROR}
_tracer = trace.get_tracer(TRACER_NAME)
_resources: dict[tuple[int, str], Resource] = {}

AttributeValue = str | bool | int | float


@dataclass
class RemoteSpan:
    """A record being placed: times are unix nanoseconds on the control plane's clock once anchored."""

    span_id: int
    parent_id: int
    name: str
    start_ns: int
    end_ns: int
    process: str
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    events: list[tuple[str, int, dict[str, AttributeValue]]] = field(default_factory=list)
    status: StatusCode = StatusCode.UNSET
    status_message: str = ""
    children: list[RemoteSpan] = field(default_factory=list)


def _value(attribute: agent_pb2.SpanAttribute) -> AttributeValue | None:
    kind = attribute.WhichOneof("value")
    value: AttributeValue | None = None if kind is None else getattr(attribute, kind)
    return value


def _attributes(items: Iterable[agent_pb2.SpanAttribute]) -> dict[str, AttributeValue]:
    return {a.key: v for a in items if (v := _value(a)) is not None}


def from_records(records: Sequence[agent_pb2.SpanRecord], trace_id: int, root_id: int) -> list[RemoteSpan]:
    """The valid records of trace `trace_id` as a forest under `root_id` (the local call's span).

    Records of another trace, with malformed or repeated ids, are dropped; a record whose parent is
    neither the call nor another record (or that sits in a parent cycle) is attached to the call.
    Returns the top-level spans (the call's direct children).
    """
    spans: dict[int, RemoteSpan] = {}
    for record in records[:MAX_REMOTE_SPANS]:
        if len(record.trace_id) != 16 or int.from_bytes(record.trace_id) != trace_id:
            continue
        if len(record.span_id) != 8 or len(record.parent_span_id) not in (0, 8):
            continue
        span_id = int.from_bytes(record.span_id)
        if span_id == 0 or span_id == root_id or span_id in spans:
            continue
        end = max(record.end_unix_nano, record.start_unix_nano)
        spans[span_id] = RemoteSpan(
            span_id=span_id, parent_id=int.from_bytes(record.parent_span_id) if record.parent_span_id else 0,
            name=record.name, start_ns=record.start_unix_nano, end_ns=end, process=record.process or "sandbox",
            attributes=_attributes(record.attributes),
            events=[(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in record.events],
            status=_STATUS.get(record.status_code, StatusCode.UNSET), status_message=record.status_message,
        )
    roots: list[RemoteSpan] = []
    placed: set[int] = set()
    # Breadth-first from the call: whatever is not reached (unknown parent, cycle) becomes a top-level span.
    for span in spans.values():
        if span.parent_id == root_id or span.parent_id not in spans:
            span.parent_id = root_id
            roots.append(span)
            placed.add(span.span_id)
    children: dict[int, list[RemoteSpan]] = {}
    for span in spans.values():
        if span.span_id not in placed:
            children.setdefault(span.parent_id, []).append(span)
    frontier = list(roots)
    while frontier:
        parent = frontier.pop()
        for child in children.pop(parent.span_id, []):
            parent.children.append(child)
            placed.add(child.span_id)
            frontier.append(child)
    for orphans in children.values():
        for span in orphans:
            if span.span_id not in placed:
                span.parent_id = root_id
                roots.append(span)
    return roots


def anchor(roots: Sequence[RemoteSpan], start_ns: int, end_ns: int) -> None:
    """Moves the remote spans onto the local clock: inside [start_ns, end_ns], each child inside its parent.

    One offset for the whole batch first (the sandbox's processes share one clock): the smallest shift
    that puts the top-level spans inside the local call. Then, top-down, a child still outside its
    parent (a process with a clock of its own) is shifted with its subtree, and clipped if it is longer.
    Spans already in place are left exactly as they were.
    """
    if not roots:
        return
    low, high = min(s.start_ns for s in roots), max(s.end_ns for s in roots)
    offset = _fit(low, high, start_ns, end_ns)
    for root in roots:
        _place(root, offset, start_ns, end_ns)


def _fit(low: int, high: int, start_ns: int, end_ns: int) -> int:
    """The smallest shift moving [low, high] inside [start_ns, end_ns]; start-aligned when it is too long."""
    if low < start_ns:
        shift = start_ns - low
    elif high > end_ns:
        shift = end_ns - high
    else:
        return 0
    return start_ns - low if low + shift < start_ns else shift


def _place(span: RemoteSpan, offset: int, start_ns: int, end_ns: int) -> None:
    offset += _fit(span.start_ns + offset, span.end_ns + offset, start_ns, end_ns)
    span.start_ns = max(span.start_ns + offset, start_ns)
    span.end_ns = max(min(span.end_ns + offset, end_ns), span.start_ns)
    span.events = [(name, min(max(at + offset, span.start_ns), span.end_ns), attrs) for name, at, attrs in span.events]
    for child in span.children:
        _place(child, offset, span.start_ns, span.end_ns)


def _resource(provider: TracerProvider, process: str) -> Resource:
    key = (id(provider.resource), process)
    resource = _resources.get(key)
    if resource is None:
        resource = _resources[key] = provider.resource.merge(Resource({SANDBOX_PROCESS: process}))
    return resource


def to_readable(roots: Sequence[RemoteSpan], parent: SpanContext, provider: TracerProvider,
                parent_process: str = "") -> list[ReadableSpan]:
    out: list[ReadableSpan] = []
    stack = [(root, parent, parent_process) for root in roots]
    while stack:
        span, parent_ctx, parent_proc = stack.pop()
        context = SpanContext(parent.trace_id, span.span_id, is_remote=False,
                              trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=parent.trace_state)
        # The parent is "remote" when it lives in another process (the call's span, or an agent span for Bun).
        parent_ref = SpanContext(parent_ctx.trace_id, parent_ctx.span_id, is_remote=parent_proc != span.process,
                                 trace_flags=parent_ctx.trace_flags, trace_state=parent_ctx.trace_state)
        status = Status(span.status, span.status_message or None) if span.status == StatusCode.ERROR else \
            Status(span.status)
        out.append(ReadableSpan(
            name=span.name, context=context, parent=parent_ref, resource=_resource(provider, span.process),
            attributes=span.attributes, kind=SpanKind.INTERNAL, status=status,
            events=[Event(name, attrs, timestamp=at) for name, at, attrs in span.events],
            start_time=span.start_ns, end_time=span.end_ns, instrumentation_scope=SCOPE,
        ))
        stack.extend((child, context, span.process) for child in span.children)
    return out


def _processor(provider: object) -> SpanProcessor | None:
    if not isinstance(provider, TracerProvider):
        return None
    # The SDK keeps no public handle on its processors; spans made elsewhere enter through this one.
    processor = getattr(provider, "_active_span_processor", None)
    return processor if isinstance(processor, SpanProcessor) else None


def emit(records: Sequence[agent_pb2.SpanRecord], parent: SpanContext, start_ns: int, end_ns: int) -> int:
    """Exports the sandbox's records of one call made under `parent` between start_ns and end_ns.

    Returns how many spans were handed on (0 without an SDK provider, where they cost nothing).
    """
    provider = trace.get_tracer_provider()
    processor = _processor(provider)
    if not records or processor is None or not parent.is_valid:
        return 0
    assert isinstance(provider, TracerProvider)
    roots = from_records(records, parent.trace_id, parent.span_id)
    anchor(roots, start_ns, end_ns)
    spans = to_readable(roots, parent, provider)
    for span in spans:
        processor.on_end(span)
    return len(spans)


class AgentCallSpan:
    """The control plane's CLIENT span of one agent RPC, its traceparent metadata, and the sandbox's spans.

    Inert (no span, no metadata) unless a recording span is current: the untraced path costs one lookup.
    """

    __slots__ = ("_done", "_span", "_start_ns", "metadata")

    def __init__(self, method: str, sandbox_id: str) -> None:
        self._span: trace.Span | None = None
        self._done = False
        self.metadata: tuple[tuple[str, str], ...] = ()
        if not trace.get_current_span().is_recording():
            return
        self._span = _tracer.start_span(f"sandbox.v1.SandboxAgent/{method}", kind=SpanKind.CLIENT,
                                        attributes={SANDBOX_ID: sandbox_id, "rpc.system": "grpc",
                                                    "rpc.method": method})
        self._start_ns = time.time_ns()
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        self.metadata = tuple(carrier.items())

    def finish(self, records: Sequence[agent_pb2.SpanRecord] = (), error: BaseException | None = None) -> None:
        """Ends the call's span (once) after re-emitting the records that came back with its last message."""
        if self._span is None or self._done:
            return
        self._done = True
        if records:
            emit(records, self._span.get_span_context(), self._start_ns, time.time_ns())
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))
        self._span.end()
