"""Spans recorded in the real Bun and Python tool hosts and in the agent's recorder (trace context in, records out)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Generator

import pytest

from sandbox.v1 import agent_pb2
from sandbox_agent import tracing
from sandbox_agent.custom.host import HostCallError, HostFile, ToolHost
from tests.unit.custom.conftest import Sandbox

TRACE_HEX = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_HEX = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_HEX}-{PARENT_HEX}-01"

SLOW = """
    import { tool } from "@opencode-ai/plugin"
    import { z } from "zod"
    await Bun.sleep(120)
    export default tool({
      description: "Slow to import", args: { n: z.number() },
      async execute(args, ctx) {
        if (args.n < 0) throw new Error("negative: " + args.n)
        await Bun.sleep(30)
        return String(args.n * 2)
      },
    })
    export const twin = tool({ description: "Twin", args: z.object({}), async execute() { return "t" } })
"""
BROKEN = "export default {{{\n"
BAD_ARGS = """
    import { tool } from "@opencode-ai/plugin"
    export default tool({ description: "bad", args: { n: 5 }, async execute() { return "" } })
"""
PY_TOOL = """
    import time
    from opencode_tool import tool

    time.sleep(0.1)

    @tool(description="Doubles", args={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    def double(args, ctx):
        if args["n"] < 0:
            raise ValueError(f"negative: {args['n']}")
        return str(args["n"] * 2)
"""


def recorder() -> tracing.Recorder:
    parent = tracing.parse_traceparent(TRACEPARENT)
    assert parent is not None
    return tracing.Recorder(parent)


def attributes(record: agent_pb2.SpanRecord) -> dict[str, object]:
    return {a.key: getattr(a, a.WhichOneof("value") or "string_value") for a in record.attributes}


def by_name(records: list[agent_pb2.SpanRecord]) -> dict[str, agent_pb2.SpanRecord]:
    named = {r.name: r for r in records}
    assert len(named) == len(records), [r.name for r in records]
    return named


def duration_ms(record: agent_pb2.SpanRecord) -> float:
    return (record.end_unix_nano - record.start_unix_nano) / 1e6


# -- the agent's recorder -----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "sampled"), [
    (TRACEPARENT, True),
    (f"00-{TRACE_HEX}-{PARENT_HEX}-03", True),  # sampled + random flag
    (f"00-{TRACE_HEX.upper()}-{PARENT_HEX}-01", True),
    (f"00-{TRACE_HEX}-{PARENT_HEX}-00", False),  # not sampled: nothing is recorded
    (f"00-{'0' * 32}-{PARENT_HEX}-01", False),
    (f"00-{TRACE_HEX}-{'0' * 16}-01", False),
    (f"ff-{TRACE_HEX}-{PARENT_HEX}-01", False),
    (f"00-{TRACE_HEX}-{PARENT_HEX}-01-extra", False),  # version 00 has exactly four fields
    (f"01-{TRACE_HEX}-{PARENT_HEX}-01-extra", True),  # a later version may add fields
    (f"00-{TRACE_HEX[:-1]}-{PARENT_HEX}-01", False),
    ("", False),
])
def test_traceparent_parsing(value: str, sampled: bool) -> None:
    parent = tracing.parse_traceparent(value)
    assert (parent is not None) == sampled
    if parent is not None:
        assert (parent.trace_id.hex(), parent.span_id.hex()) == (TRACE_HEX, PARENT_HEX)


def test_a_recorder_only_for_a_sampled_traceparent_in_the_metadata() -> None:
    assert tracing.recorder_from_metadata(None) is None
    assert tracing.recorder_from_metadata([("authorization", "x")]) is None
    assert tracing.recorder_from_metadata([("traceparent", TRACEPARENT.replace("-01", "-00"))]) is None
    found = tracing.recorder_from_metadata([("x", "y"), ("traceparent", TRACEPARENT)])
    assert found is not None
    assert found.trace_id.hex() == TRACE_HEX
    assert found.parent_id.hex() == PARENT_HEX


def test_nested_spans_errors_and_attribute_types() -> None:
    rec = recorder()
    inner: tracing.Span | None = None

    def nested() -> None:
        nonlocal inner
        with tracing.span(rec, "outer", {"i": 3, "f": 0.5, "b": True, "s": "x"}):
            with tracing.child("inner") as inner:
                assert inner is not None
                assert tracing.host_trace() == {"trace_id": TRACE_HEX, "parent_id": inner.span_id.hex()}
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        nested()
    assert tracing.host_trace() is None
    spans = by_name(rec.drain())
    assert spans["inner"].parent_span_id == spans["outer"].span_id
    assert spans["outer"].parent_span_id.hex() == PARENT_HEX
    assert spans["outer"].trace_id.hex() == TRACE_HEX
    assert attributes(spans["outer"]) == {"i": 3, "f": 0.5, "b": True, "s": "x"}
    assert (spans["outer"].status_code, spans["outer"].status_message) == (agent_pb2.SPAN_STATUS_ERROR, "boom")
    assert spans["inner"].status_code == agent_pb2.SPAN_STATUS_UNSET
    assert spans["outer"].start_unix_nano <= spans["inner"].start_unix_nano <= spans["inner"].end_unix_nano \
        <= spans["outer"].end_unix_nano
    assert rec.drain() == []


def test_without_a_recorder_nothing_is_recorded() -> None:
    with tracing.span(None, "outer") as outer, tracing.child("inner") as inner:
        assert outer is None
        assert inner is None
        assert tracing.host_trace() is None


def test_host_spans_outside_the_trace_or_malformed_are_dropped_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder()
    good = {"trace_id": TRACE_HEX, "span_id": "1" * 16, "parent_id": PARENT_HEX, "name": "ok", "start_ms": 1.5,
            "end_ms": 2.25, "attributes": {"n": 1, "obj": {"no": 1}}, "status": "error", "message": "m",
            "events": [{"name": "e", "time_ms": 2, "attributes": {}}, "junk"]}
    rec.adopt([good, {**good, "trace_id": "f" * 32}, {**good, "span_id": "xyz"}, {**good, "start_ms": "1"},
               {**good, "end_ms": True}, "junk"], "bun-host")
    (only,) = rec.drain()
    assert (only.name, only.process) == ("ok", "bun-host")
    assert (only.start_unix_nano, only.end_unix_nano) == (1_500_000, 2_250_000)
    assert attributes(only) == {"n": 1}
    assert (only.status_code, only.status_message) == (agent_pb2.SPAN_STATUS_ERROR, "m")
    assert [(e.name, e.time_unix_nano) for e in only.events] == [("e", 2_000_000)]
    monkeypatch.setattr(tracing, "MAX_SPANS", 2)
    rec.adopt([good] * 5, "bun-host")
    assert len(rec.drain()) == 2


# -- the Bun host -------------------------------------------------------------------------------------


async def test_bun_load_records_init_spans_per_tool_and_per_failure(sandbox: Sandbox, bun_host: ToolHost) -> None:
    slow, broken = sandbox.tool("slow.ts", SLOW), sandbox.tool("broken.ts", BROKEN)
    bad = sandbox.tool("bad.ts", BAD_ARGS)
    rec = recorder()
    with tracing.span(rec, "toolhost.load bun") as load_span:
        loaded = await bun_host.load([HostFile(p, "tool") for p in (slow, broken, bad)], str(sandbox.project),
                                     str(sandbox.project))
    assert load_span is not None
    spans = by_name(rec.drain())
    assert sorted(spans) == ["init_tool bad", "init_tool broken", "init_tool slow", "init_tool slow_twin",
                             "toolhost.load bun", "toolhost.start bun"]
    init = spans["init_tool slow"]
    assert init.process == "bun-host"
    assert init.trace_id.hex() == TRACE_HEX
    assert init.parent_span_id == load_span.span_id
    assert attributes(init) == {"gen_ai.tool.name": "slow", "sandbox.tool.origin": slow,
                                "sandbox.tool.source": "custom",
                                "sandbox.init_ms": next(t.init_ms for t in loaded.tools if t.id == "slow")}
    assert 120 <= duration_ms(init) < 5000  # the module's top-level await is part of the tool's init
    assert abs(duration_ms(init) - attributes(init)["sandbox.init_ms"]) < 0.01  # type: ignore[operator]
    assert [e.name for e in init.events] == ["module imported"]
    assert init.start_unix_nano < init.events[0].time_unix_nano <= init.end_unix_nano
    assert spans["init_tool broken"].status_code == agent_pb2.SPAN_STATUS_ERROR
    assert spans["init_tool broken"].status_message == next(e.message for e in loaded.load_errors if e.origin == broken)
    assert attributes(spans["init_tool bad"])["sandbox.tool.origin"] == bad
    assert spans["init_tool bad"].status_message == "tool bad: args.n is not a zod schema"
    assert spans["toolhost.start bun"].parent_span_id == load_span.span_id
    for name in ("init_tool slow", "init_tool slow_twin", "init_tool broken"):
        record = spans[name]
        assert load_span.start_ns <= record.start_unix_nano <= record.end_unix_nano <= load_span.end_ns, name

    # Unchanged files are not imported again: no init spans on the next listing.
    with tracing.span(rec, "again"):
        await bun_host.load([HostFile(p, "tool") for p in (slow, broken, bad)], str(sandbox.project),
                            str(sandbox.project))
    assert [r.name for r in rec.drain()] == ["again"]


async def test_bun_call_records_an_execute_span_under_the_agent_span(sandbox: Sandbox, bun_host: ToolHost) -> None:
    slow = sandbox.tool("slow.ts", SLOW)
    await bun_host.load([HostFile(slow, "tool")], str(sandbox.project), str(sandbox.project))
    rec = recorder()
    with tracing.span(rec, "sandbox.tool slow") as agent_span:
        assert (await sandbox.call(bun_host, "slow", {"n": 21})).output == "42"
        with pytest.raises(HostCallError, match="negative: -1"):
            await sandbox.call(bun_host, "slow", {"n": -1})
        with pytest.raises(HostCallError, match="invalid arguments"):
            await sandbox.call(bun_host, "slow", {"n": "x"})
    assert agent_span is not None
    records = rec.drain()
    executes = [r for r in records if r.name == "toolhost.execute slow"]
    assert len(executes) == 3
    ok, failed, invalid = executes
    assert all(r.parent_span_id == agent_span.span_id and r.process == "bun-host" for r in executes)
    assert attributes(ok) == {"gen_ai.tool.name": "slow", "gen_ai.tool.call.id": "call_1",
                              "sandbox.tool.origin": slow, "sandbox.tool.source": "custom"}
    assert ok.status_code == agent_pb2.SPAN_STATUS_UNSET
    assert 30 <= duration_ms(ok) < 5000
    assert (failed.status_code, failed.status_message) == (agent_pb2.SPAN_STATUS_ERROR, "negative: -1")
    assert invalid.status_code == agent_pb2.SPAN_STATUS_ERROR
    assert invalid.status_message.startswith("The slow tool was called with invalid arguments")
    for record in executes:
        assert agent_span.start_ns <= record.start_unix_nano <= record.end_unix_nano <= agent_span.end_ns
    assert len({r.span_id for r in records}) == len(records)


async def test_an_untraced_bun_request_carries_no_spans(sandbox: Sandbox, bun_host: ToolHost) -> None:
    slow = sandbox.tool("slow.ts", SLOW)
    process = await bun_host._running()
    reply = await bun_host._exchange(process, {"type": "load", "files": [{"path": slow, "kind": "tool"}],
                                               "directory": str(sandbox.project), "worktree": str(sandbox.project)})
    assert [t["id"] for t in reply["tools"]] == ["slow", "slow_twin"]
    assert "spans" not in reply
    rec = recorder()
    with tracing.span(rec, "other"):
        pass
    assert (await sandbox.call(bun_host, "slow", {"n": 1})).output == "2"
    assert [r.name for r in rec.drain()] == ["other"]


# -- the Python host ----------------------------------------------------------------------------------


async def test_python_host_records_init_and_execute_spans(sandbox: Sandbox, py_host: ToolHost) -> None:
    path = sandbox.tool("double.py", PY_TOOL)
    broken = sandbox.tool("broken.py", "raise RuntimeError('no import today')\n")
    rec = recorder()
    with tracing.span(rec, "toolhost.load python") as load_span:
        loaded = await py_host.load([HostFile(path, "tool"), HostFile(broken, "tool")], str(sandbox.project),
                                    str(sandbox.project))
    with tracing.span(rec, "sandbox.tool double_double") as call_span:
        assert (await sandbox.call(py_host, "double_double", {"n": 4})).output == "8"
        with pytest.raises(HostCallError, match="negative: -2"):
            await sandbox.call(py_host, "double_double", {"n": -2})
    assert load_span is not None
    assert call_span is not None
    records = rec.drain()
    spans = {r.name: r for r in records}
    init = spans["init_tool double_double"]
    assert init.process == "python-host"
    assert init.parent_span_id == load_span.span_id
    assert attributes(init) == {"gen_ai.tool.name": "double_double", "sandbox.tool.origin": path,
                                "sandbox.tool.source": "custom", "sandbox.init_ms": loaded.tools[0].init_ms}
    assert 100 <= duration_ms(init) < 5000
    assert load_span.start_ns <= init.start_unix_nano <= init.end_unix_nano <= load_span.end_ns
    assert (spans["init_tool broken"].status_code, spans["init_tool broken"].status_message) == (
        agent_pb2.SPAN_STATUS_ERROR, "RuntimeError: no import today")
    executes = [r for r in records if r.name == "toolhost.execute double_double"]
    assert [r.status_code for r in executes] == [agent_pb2.SPAN_STATUS_UNSET, agent_pb2.SPAN_STATUS_ERROR]
    assert executes[1].status_message == "negative: -2"
    assert all(r.parent_span_id == call_span.span_id for r in executes)
    assert attributes(executes[0])["gen_ai.tool.call.id"] == "call_1"


async def test_concurrent_traced_calls_keep_their_own_parents(sandbox: Sandbox, bun_host: ToolHost) -> None:
    slow = sandbox.tool("slow.ts", SLOW)
    await bun_host.load([HostFile(slow, "tool")], str(sandbox.project), str(sandbox.project))

    async def one(n: int) -> tuple[bytes, list[agent_pb2.SpanRecord]]:
        rec = recorder()
        with tracing.span(rec, f"call {n}") as span:
            await sandbox.call(bun_host, "slow", {"n": n})
        assert span is not None
        return span.span_id, [r for r in rec.drain() if r.name.startswith("toolhost")]

    results = await asyncio.gather(*(one(n) for n in range(4)))
    for span_id, host_spans in results:
        assert [r.parent_span_id for r in host_spans] == [span_id]


def test_a_span_closed_from_another_context_neither_raises_nor_loses_its_end() -> None:
    """A suspended call's coroutine closed by the garbage collector runs its span's exit in another context:
    that must not raise (it surfaced as an unraisable exception in whichever test ran next)."""
    kept = recorder()

    class Suspend:
        def __await__(self) -> Generator[None, None, None]:
            yield  # as a call waiting on its loop does

    async def call() -> None:
        with tracing.span(kept, "sandbox.tool write"):
            await Suspend()

    coroutine = call()
    contextvars.copy_context().run(coroutine.send, None)  # suspended inside the span, in a context of its own
    coroutine.close()  # GeneratorExit, in this (another) context
    assert [record.name for record in kept.drain()] == ["sandbox.tool write"]
