"""One trace from the test's span through the control plane into the sandbox agent and the Bun host.

The sandbox's spans come back inside agent responses and are exported by the control plane; here an
in-memory SDK exporter collects them. Run against a real Docker sandbox and an in-process agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from tests.archives import tar_of
from tests.planes import Plane, running_plane
from tests.tracing import memory_exporter

# The control plane adds its tracing interceptor only when an SDK provider exists as its server is
# built, and the shared session-scoped plane may be started by any module: install it at collection.
memory_exporter()
tracer = trace.get_tracer("tests.docker.test_tracing_sandbox")

SLOW_TS = """import { tool } from "@opencode-ai/plugin"
await Bun.sleep(150)
export default tool({
  description: "Doubles slowly",
  args: { n: tool.schema.number() },
  async execute(args) {
    if (args.n < 0) throw new Error(`negative: ${args.n}`)
    await Bun.sleep(20)
    return String(args.n * 2)
  },
})
"""
BROKEN_TS = "export default tool({ description: 'x', args: {, })\n"
# The in-process agent has no Bun on this host's PATH: its variant uses the Python tool host.
SLOW_PY = """import asyncio
import time

from opencode_tool import tool

time.sleep(0.15)


@tool(description="Doubles slowly", args={"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]})
async def default(args, ctx):
    if args["n"] < 0:
        raise ValueError(f"negative: {args['n']}")
    await asyncio.sleep(0.02)
    return str(args["n"] * 2)
"""
BROKEN_PY = "raise RuntimeError('no import today')\n"


def by_id(spans: Sequence[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans if s.context is not None}


def chain(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> list[str]:
    """The names from `span` up to the root of its trace (as far as the exported spans reach)."""
    names = [span.name]
    while span.parent is not None and span.parent.span_id in spans:
        span = spans[span.parent.span_id]
        names.append(span.name)
    return names


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, sorted(s.name for s in spans))
    return found[0]


def complete(spans: Sequence[ReadableSpan]) -> bool:
    index = by_id(spans)
    return all(s.parent is None or s.parent.span_id in index for s in spans)


async def spans_of(trace_id: int, *names: str) -> list[ReadableSpan]:
    """The trace's spans once every name is among them and every parent has ended (server spans end
    just after the client saw the reply)."""
    exporter = memory_exporter()
    for _ in range(500):
        spans = [s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id]
        if set(names) <= {s.name for s in spans} and complete(spans):
            return spans
        await asyncio.sleep(0.01)
    raise AssertionError(f"missing {set(names) - {s.name for s in spans}} in {sorted({s.name for s in spans})}")


def assert_nested(spans: Sequence[ReadableSpan]) -> None:
    """Every span recorded in the sandbox lies within its parent's interval, whatever clock recorded it.

    (A control-plane server span may outlive its client's span: the stream closes after the last reply.)
    """
    index = by_id(spans)
    for span in spans:
        parent = index.get(span.parent.span_id) if span.parent is not None else None
        if parent is None or "sandbox.process" not in span.resource.attributes:
            continue
        assert span.start_time is not None
        assert span.end_time is not None
        assert parent.start_time is not None
        assert parent.end_time is not None
        assert parent.start_time <= span.start_time <= span.end_time <= parent.end_time, (span.name, parent.name)


async def check_one_trace(plane: Plane, host: str) -> None:
    """`host` is the tool host that runs slow/broken: "bun" (TypeScript files) or "python"."""
    ext = "ts" if host == "bun" else "py"
    workspace = {f".opencode/tool/slow.{ext}": SLOW_TS if host == "bun" else SLOW_PY,
                 f".opencode/tool/broken.{ext}": BROKEN_TS if host == "bun" else BROKEN_PY}
    client = plane.client
    with tracer.start_as_current_span("test root") as root:
        session = await client.create_session(workspace_archive=tar_of(workspace))
        listing = await client.list_tools(session.id)
        assert "slow" in [t.id for t in listing.tools]
        assert (await client.execute_tool(session.id, "bash", {"command": "echo hi", "description": "Says hi"},
                                          call_id="call_bash")).output == "hi\n"
        assert (await client.execute_tool(session.id, "slow", {"n": 21}, call_id="call_slow")).output == "42"
        failed = await client.execute_tool(session.id, "slow", {"n": -1}, call_id="call_fail")
        assert failed.error == "negative: -1"
        assert (await client.run(session.id, ["sh", "-c", "exit 3"])).exit_code == 3
    trace_id = root.get_span_context().trace_id
    spans = await spans_of(trace_id, "test root", "init_tool slow", "init_tool broken", "sandbox.tool bash",
                           "sandbox.tool slow", "toolhost.execute slow", "sandbox.list_custom_tools", "sandbox.exec")
    index = by_id(spans)
    assert {s.context.trace_id for s in spans if s.context is not None} == {trace_id}
    # The control plane has init_tool spans of its own; these are the ones the tool host made.
    in_sandbox = [s for s in spans if "sandbox.process" in s.resource.attributes]

    init = one(in_sandbox, "init_tool slow")
    assert chain(init, index)[:4] == ["init_tool slow", f"toolhost.load {host}", "sandbox.list_custom_tools",
                                      "sandbox.v1.SandboxAgent/ListCustomTools"]
    assert chain(init, index)[-1] == "test root"
    assert init.resource.attributes["sandbox.process"] == f"{host}-host"
    assert init.attributes is not None
    assert str(init.attributes["sandbox.tool.origin"]).endswith(f"/.opencode/tool/slow.{ext}")
    assert init.start_time is not None
    assert init.end_time is not None
    assert (init.end_time - init.start_time) / 1e6 >= 150  # the module's top-level sleep is the tool's init
    broken = one(in_sandbox, "init_tool broken")
    assert broken.status.status_code == StatusCode.ERROR
    load_error = next(e.message for e in listing.load_errors if e.origin.endswith(f"broken.{ext}"))
    assert broken.status.description == load_error

    bash = one(spans, "sandbox.tool bash")
    assert chain(bash, index)[:2] == ["sandbox.tool bash", "sandbox.v1.SandboxAgent/RunTool"]
    assert chain(bash, index)[-1] == "test root"
    assert bash.resource.attributes["sandbox.process"] == "sandbox-agent"
    assert bash.attributes is not None
    assert (bash.attributes["gen_ai.tool.call.id"], bash.attributes["sandbox.outcome"]) == ("call_bash", "ok")

    executes = sorted((s for s in spans if s.name == "toolhost.execute slow"), key=lambda s: s.start_time or 0)
    assert len(executes) == 2
    ok, bad = executes
    assert chain(ok, index)[:3] == ["toolhost.execute slow", "sandbox.tool slow", "sandbox.v1.SandboxAgent/RunTool"]
    assert chain(ok, index)[-1] == "test root"
    assert ok.resource.attributes["sandbox.process"] == f"{host}-host"
    assert ok.attributes is not None
    assert ok.attributes["gen_ai.tool.call.id"] == "call_slow"
    assert ok.status.status_code == StatusCode.UNSET
    assert (bad.status.status_code, bad.status.description) == (StatusCode.ERROR, "negative: -1")
    assert bad.parent is not None
    agent_side = index[bad.parent.span_id]
    assert (agent_side.status.status_code, agent_side.status.description) == (StatusCode.ERROR, "negative: -1")
    exec_span = one(spans, "sandbox.exec")
    assert chain(exec_span, index)[:2] == ["sandbox.exec", "sandbox.v1.SandboxAgent/Exec"]
    assert chain(exec_span, index)[-1] == "test root"
    assert exec_span.attributes is not None
    assert exec_span.attributes["process.exit.code"] == 3
    assert exec_span.status.status_code == StatusCode.UNSET  # a non-zero exit is the command's answer
    assert_nested(spans)


@pytest.mark.docker
async def test_one_trace_from_the_client_into_the_docker_sandbox_and_bun(docker_plane: Plane) -> None:
    await check_one_trace(docker_plane, "bun")


async def test_one_trace_into_an_in_process_agent() -> None:
    async with running_plane("local") as plane:
        await check_one_trace(plane, "python")
