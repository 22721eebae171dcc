"""One session in a real sandbox, traced over OTLP/gRPC to a real collector (rotel) on loopback: a custom
tool whose module takes ~1.5 s to import shows that time on its `init_tool` span (made inside Bun)."""

from __future__ import annotations

import asyncio
import shutil
import signal

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import tool_pb2
from scripts.trace_demo_receiver import ExportedSpan, Rotel
from tests.archives import tar_of
from tests.planes import PlaneProcess, new_instance, remove_instance_leftovers, short_tmp

pytestmark = pytest.mark.docker

SLOW_TS = """import { tool } from "@opencode-ai/plugin"

await new Promise((resolve) => setTimeout(resolve, 1500))

export default tool({
  description: "Answers after a slow start",
  args: { word: tool.schema.string() },
  async execute(args) { return `slow says ${args.word}` },
})
"""


def named(spans: list[ExportedSpan], name: str) -> list[ExportedSpan]:
    return [s for s in spans if s.name == name]


async def test_a_slow_custom_tool_is_traced_end_to_end(rotel: Rotel) -> None:
    instance = new_instance("otlp")
    plane = PlaneProcess(short_tmp(), instance, pool_size=0)
    plane.env = {k: v for k, v in plane.env.items() if not k.startswith("OTEL_")} | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": rotel.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "ocsb-docker-trace",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",  # nothing leaves before shutdown: the flush on SIGTERM is tested
    }
    address = await plane.start()
    try:
        async with AsyncClient(address, plane.token()) as client:
            session = await client.create_session(workspace_archive=tar_of({".opencode/tool/slow.ts": SLOW_TS}))
            listing = await client.list_tools(session.id)
            [slow] = [t for t in listing.tools if t.id == "slow"]
            assert slow.source == tool_pb2.ToolDefinition.CUSTOM
            assert slow.init_ms >= 1400
            outcome = await client.execute_tool(session.id, "slow", {"word": "hi"}, call_id="call_slow")
            assert outcome.output == "slow says hi"
            await client.delete_session(session.id)
        assert plane.proc is not None
        plane.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(plane.proc.wait, 60) == 0
    finally:
        if plane.proc is not None and plane.proc.poll() is None:
            plane.kill()
        remove_instance_leftovers(instance)
        shutil.rmtree(plane.data_dir, ignore_errors=True)

    spans = await asyncio.to_thread(rotel.wait_for, "execute_tool slow", 10)
    assert {s.service for s in spans} == {"ocsb-docker-trace"}
    [call] = named(spans, "execute_tool slow")
    assert call.attributes["sandbox.tool.source"] == "CUSTOM"
    assert call.attributes["sandbox.tool.origin"] == "/workspace/.opencode/tool/slow.ts"
    assert call.attributes["sandbox.outcome"] == "ok"
    assert call.attributes["sandbox.output.bytes"] == len(b"slow says hi")
    assert call.attributes["sandbox.id"] == session.sandbox_id
    [listed] = named(spans, "/controlplane.v1.ToolService/ListTools")
    builtin_inits = [s for s in spans if s.parent_id == listed.span_id and s.name == "init_tool bash"]
    assert len(builtin_inits) == 1
    [acquire] = named(spans, "acquire_sandbox")
    assert acquire.attributes["sandbox.pool.hit"] is False
    assert acquire.attributes["sandbox.id"] == session.sandbox_id
    assert acquire.duration_s > 0.05  # a real container start, not a no-op span

    # The import itself is timed inside the sandbox's Bun host and re-emitted by the control plane
    # (helper H's half of the feature): one span, under the ListTools call that loaded the tool. The
    # call itself has nothing left to initialise, so it adds no second `init_tool slow`.
    [init] = named(spans, "init_tool slow")
    assert 1.4 <= init.duration_s < 10
    by_id = {s.span_id: s for s in spans}
    ancestors, parent = [], by_id.get(init.parent_id)
    while parent is not None:
        ancestors.append(parent.name)
        parent = by_id.get(parent.parent_id)
    assert ancestors[-1] == "/controlplane.v1.ToolService/ListTools", ancestors
    assert init.trace_id == listed.trace_id
