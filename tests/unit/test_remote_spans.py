"""Sandbox span records re-emitted by the control plane: trust checks, parent links, clock-skew anchoring."""

from __future__ import annotations

import os

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags

from controlplane.telemetry import remote
from sandbox.v1 import agent_pb2
from tests.tracing import memory_exporter

MS = 1_000_000
T0 = 1_800_000_000_000 * MS  # the control plane's "now" in these tests (unix ns)
TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALL = 0xB7AD6B7169203331


def sid(n: int) -> bytes:
    return (0x1000 + n).to_bytes(8)


def record(n: int, parent: int | bytes, start_ms: float, end_ms: float, *, skew_ms: float = 0, name: str = "",
           process: str = "sandbox-agent", trace_id: int = TRACE, **extra: object) -> agent_pb2.SpanRecord:
    """A record made on a sandbox clock running `skew_ms` ahead of ours; times relative to T0."""
    parent_id = parent if isinstance(parent, bytes) else (CALL.to_bytes(8) if parent == 0 else sid(parent))
    return agent_pb2.SpanRecord(
        trace_id=trace_id.to_bytes(16), span_id=sid(n), parent_span_id=parent_id, name=name or f"span {n}",
        start_unix_nano=T0 + round((start_ms + skew_ms) * MS), end_unix_nano=T0 + round((end_ms + skew_ms) * MS),
        process=process, **extra,  # type: ignore[arg-type]
    )


def call_context() -> SpanContext:
    return SpanContext(TRACE, CALL, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def emitted(records: list[agent_pb2.SpanRecord], start_ms: float = 0, end_ms: float = 100) -> dict[str, ReadableSpan]:
    exporter = memory_exporter()
    exporter.clear()
    count = remote.emit(records, call_context(), T0 + round(start_ms * MS), T0 + round(end_ms * MS))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert count == len(spans)
    return spans


def interval_ms(span: ReadableSpan) -> tuple[float, float]:
    assert span.start_time is not None
    assert span.end_time is not None
    return (span.start_time - T0) / MS, (span.end_time - T0) / MS


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None
    return span.parent.span_id


# -- clock skew ---------------------------------------------------------------------------------------


def batch(skew_ms: float) -> list[agent_pb2.SpanRecord]:
    return [
        record(1, 0, 10, 60, skew_ms=skew_ms, name="sandbox.tool bash"),
        record(2, 1, 20, 50, skew_ms=skew_ms, name="toolhost.execute x", process="bun-host"),
        record(3, 2, 25, 30, skew_ms=skew_ms, name="inner", process="bun-host"),
    ]


def test_spans_already_inside_the_call_are_left_exactly_as_they_were() -> None:
    spans = emitted(batch(0))
    assert interval_ms(spans["sandbox.tool bash"]) == (10, 60)
    assert interval_ms(spans["toolhost.execute x"]) == (20, 50)
    assert interval_ms(spans["inner"]) == (25, 30)


def test_a_sandbox_clock_ahead_is_shifted_back_to_end_with_the_call_keeping_offsets() -> None:
    spans = emitted(batch(5_000))
    assert interval_ms(spans["sandbox.tool bash"]) == (50, 100)
    assert interval_ms(spans["toolhost.execute x"]) == (60, 90)
    assert interval_ms(spans["inner"]) == (65, 70)


def test_a_sandbox_clock_behind_is_shifted_forward_to_start_with_the_call() -> None:
    spans = emitted(batch(-3_600_000))
    assert interval_ms(spans["sandbox.tool bash"]) == (0, 50)
    assert interval_ms(spans["toolhost.execute x"]) == (10, 40)
    assert interval_ms(spans["inner"]) == (15, 20)


def test_a_skew_smaller_than_the_slack_moves_only_as_far_as_needed() -> None:
    spans = emitted(batch(-12))  # the root would start 2 ms before the call
    assert interval_ms(spans["sandbox.tool bash"]) == (0, 50)
    assert interval_ms(spans["inner"]) == (15, 20)


def test_a_remote_span_longer_than_the_call_is_clipped_to_it() -> None:
    spans = emitted([record(1, 0, -40, 170, name="long"), record(2, 1, -30, -20, name="early child")])
    assert interval_ms(spans["long"]) == (0, 100)
    # Aligned at the call's start with its parent: the child keeps its offset from the parent's start.
    assert interval_ms(spans["early child"]) == (10, 20)


def test_a_child_on_a_clock_of_its_own_is_moved_into_its_parent_with_its_subtree() -> None:
    records = [
        record(1, 0, 10, 90, name="agent"),
        record(2, 1, 1_000 + 20, 1_000 + 40, name="bun", process="bun-host"),  # Bun's clock 1 s ahead
        record(3, 2, 1_000 + 25, 1_000 + 30, name="bun child", process="bun-host"),
    ]
    spans = emitted(records)
    assert interval_ms(spans["agent"]) == (10, 90)
    assert interval_ms(spans["bun"]) == (70, 90)
    assert interval_ms(spans["bun child"]) == (75, 80)


def test_every_child_ends_inside_its_parent_whatever_the_skews() -> None:
    records = [record(1, 0, 0, 30, skew_ms=-50, name="a"), record(2, 1, 40, 45, skew_ms=9_000, name="b"),
               record(3, 2, -5, 500, name="c"), record(4, 0, 70, 90, skew_ms=7, name="d")]
    spans = emitted(records, 0, 100)
    by_id = {s.context.span_id: s for s in spans.values()}
    for span in spans.values():
        start, end = interval_ms(span)
        parent = by_id.get(parent_of(span))
        low, high = interval_ms(parent) if parent is not None else (0, 100)
        assert low <= start <= end <= high, span.name


def test_events_move_with_their_span() -> None:
    event = agent_pb2.SpanEvent(name="module imported", time_unix_nano=T0 + 5_030 * MS)
    spans = emitted([record(1, 0, 10, 60, skew_ms=5_000, name="init", events=[event])])
    assert [(e.name, (e.timestamp - T0) / MS) for e in spans["init"].events] == [("module imported", 70)]


# -- trust and parent links ---------------------------------------------------------------------------


def test_parent_links_follow_the_records_and_hang_under_the_call() -> None:
    spans = emitted(batch(0))
    assert parent_of(spans["sandbox.tool bash"]) == CALL
    assert parent_of(spans["toolhost.execute x"]) == int.from_bytes(sid(1))
    assert parent_of(spans["inner"]) == int.from_bytes(sid(2))
    assert {s.context.trace_id for s in spans.values()} == {TRACE}
    assert all(s.context.trace_flags.sampled for s in spans.values())


def test_a_parent_is_remote_only_across_processes() -> None:
    spans = emitted(batch(0))
    assert spans["sandbox.tool bash"].parent.is_remote  # type: ignore[union-attr]
    assert spans["toolhost.execute x"].parent.is_remote  # type: ignore[union-attr]
    assert not spans["inner"].parent.is_remote  # type: ignore[union-attr]


def test_records_of_another_trace_or_with_bad_ids_are_dropped() -> None:
    records = [
        record(1, 0, 10, 20, name="kept"),
        record(2, 0, 10, 20, name="other trace", trace_id=TRACE + 1),
        record(1, 0, 10, 20, name="duplicate id"),
        agent_pb2.SpanRecord(trace_id=TRACE.to_bytes(16), span_id=bytes(8), name="zero id",
                             start_unix_nano=T0, end_unix_nano=T0),
        agent_pb2.SpanRecord(trace_id=TRACE.to_bytes(16), span_id=b"\x01\x02", name="short id",
                             start_unix_nano=T0, end_unix_nano=T0),
        agent_pb2.SpanRecord(trace_id=TRACE.to_bytes(16), span_id=CALL.to_bytes(8), name="the call's own id",
                             start_unix_nano=T0, end_unix_nano=T0),
    ]
    assert sorted(emitted(records)) == ["kept"]


def test_unknown_parents_and_cycles_are_attached_to_the_call() -> None:
    records = [
        record(1, 0, 10, 90, name="root"),
        record(2, b"\x99" * 8, 20, 30, name="forged parent"),
        record(3, 4, 40, 50, name="cycle a"),
        record(4, 3, 45, 55, name="cycle b"),
        record(5, 1, 60, 70, name="child"),
    ]
    spans = emitted(records)
    assert {name: parent_of(s) for name, s in spans.items()} == {
        "root": CALL, "forged parent": CALL, "cycle a": CALL, "cycle b": CALL, "child": int.from_bytes(sid(1)),
    }


def test_at_most_the_cap_of_records_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "MAX_REMOTE_SPANS", 3)
    assert len(emitted([record(n, 0, 1, 2) for n in range(1, 10)])) == 3


# -- content ------------------------------------------------------------------------------------------


def test_attribute_types_status_and_resource() -> None:
    attributes = [
        agent_pb2.SpanAttribute(key="s", string_value="text"), agent_pb2.SpanAttribute(key="i", int_value=-7),
        agent_pb2.SpanAttribute(key="d", double_value=2.5), agent_pb2.SpanAttribute(key="b", bool_value=False),
        agent_pb2.SpanAttribute(key="empty"),
    ]
    spans = emitted([
        record(1, 0, 1, 2, name="failed", attributes=attributes, status_code=agent_pb2.SPAN_STATUS_ERROR,
               status_message="Unknown tool: x", process="bun-host"),
        record(2, 0, 1, 2, name="ok", status_code=agent_pb2.SPAN_STATUS_OK, status_message="ignored"),
        record(3, 0, 1, 2, name="unset", process=""),
    ])
    failed = spans["failed"]
    assert dict(failed.attributes or {}) == {"s": "text", "i": -7, "d": 2.5, "b": False}
    assert [type(v) for v in (failed.attributes or {}).values()] == [str, int, float, bool]
    assert (failed.status.status_code, failed.status.description) == (StatusCode.ERROR, "Unknown tool: x")
    assert (spans["ok"].status.status_code, spans["ok"].status.description) == (StatusCode.OK, None)
    assert spans["unset"].status.status_code == StatusCode.UNSET
    provider = trace.get_tracer_provider()
    service = provider.resource.attributes["service.name"]  # type: ignore[attr-defined]
    assert failed.resource.attributes["service.name"] == service
    assert failed.resource.attributes["sandbox.process"] == "bun-host"
    assert spans["ok"].resource.attributes["sandbox.process"] == "sandbox-agent"
    assert spans["unset"].resource.attributes["sandbox.process"] == "sandbox"
    assert failed.instrumentation_scope is not None
    assert failed.instrumentation_scope.name == "ocsandbox.sandbox"


def test_nothing_is_emitted_without_an_sdk_provider_or_a_valid_parent() -> None:
    assert remote._processor(trace.NoOpTracerProvider()) is None
    exporter = memory_exporter()
    exporter.clear()
    assert remote.emit([record(1, 0, 1, 2)], trace.INVALID_SPAN_CONTEXT, T0, T0 + 100 * MS) == 0
    assert remote.emit([], call_context(), T0, T0 + 100 * MS) == 0
    assert exporter.get_finished_spans() == ()


# -- the client span of an agent call -----------------------------------------------------------------


def test_an_agent_call_outside_a_trace_is_inert() -> None:
    exporter = memory_exporter()
    exporter.clear()
    traced = remote.AgentCallSpan("RunTool", "sbx")
    assert traced.metadata == ()
    traced.finish([record(1, 0, 1, 2)])
    assert exporter.get_finished_spans() == ()


def test_an_agent_call_sends_its_traceparent_and_adopts_the_records() -> None:
    exporter = memory_exporter()
    exporter.clear()
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("test root") as root:
        traced = remote.AgentCallSpan("RunTool", "sbx1")
        headers = dict(traced.metadata)
        version, trace_hex, parent_hex, flags = headers["traceparent"].split("-")
        assert (version, int(trace_hex, 16)) == ("00", root.get_span_context().trace_id)
        assert int(flags, 16) & 1  # sampled
        sandbox_span = agent_pb2.SpanRecord(
            trace_id=bytes.fromhex(trace_hex), span_id=os.urandom(7) + b"\x01",
            parent_span_id=bytes.fromhex(parent_hex),
            name="sandbox.tool bash", start_unix_nano=1, end_unix_nano=2,  # a sandbox clock at the epoch
        )
        traced.finish([sandbox_span])
        traced.finish([sandbox_span], error=RuntimeError("late"))  # once only
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == ["sandbox.tool bash", "sandbox.v1.SandboxAgent/RunTool", "test root"]
    client = spans["sandbox.v1.SandboxAgent/RunTool"]
    assert client.context.span_id == int(parent_hex, 16)
    assert parent_of(client) == root.get_span_context().span_id
    assert client.kind == trace.SpanKind.CLIENT
    assert client.attributes is not None
    assert client.attributes["sandbox.id"] == "sbx1"
    assert client.status.status_code == StatusCode.UNSET
    inner = spans["sandbox.tool bash"]
    assert parent_of(inner) == client.context.span_id
    assert client.start_time is not None
    assert client.end_time is not None
    assert inner.start_time is not None
    assert inner.end_time is not None
    assert client.start_time <= inner.start_time <= inner.end_time <= client.end_time


def test_a_failed_agent_call_ends_its_span_with_the_error() -> None:
    exporter = memory_exporter()
    exporter.clear()
    with trace.get_tracer("test").start_as_current_span("test root"):
        traced = remote.AgentCallSpan("ListCustomTools", "sbx")
        traced.finish(error=RuntimeError("sandbox sbx is not answering"))
    client = next(s for s in exporter.get_finished_spans() if s.name.endswith("ListCustomTools"))
    assert (client.status.status_code, client.status.description) == (StatusCode.ERROR, "sandbox sbx is not answering")
