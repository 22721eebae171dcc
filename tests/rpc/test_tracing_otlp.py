"""A real control-plane process exporting OTLP (gRPC and HTTP), configured only by OTEL_* variables,
to a real collector (rotel) on loopback; the spans are read back from the collector's debug log."""

from __future__ import annotations

import asyncio
import shutil
import signal

import pytest

from controlplane.client import AsyncClient
from scripts.trace_demo_receiver import ExportedSpan, Rotel
from tests.planes import PlaneProcess, new_instance, short_tmp


async def stop(plane: PlaneProcess) -> None:
    """SIGTERM, then SIGKILL: a served plane with the local provider may not stop by itself (see report)."""
    process = plane.proc
    assert process is not None
    process.send_signal(signal.SIGTERM)
    for _ in range(150):
        if process.poll() is not None:
            return
        await asyncio.sleep(0.1)
    plane.kill()


def one(spans: list[ExportedSpan], name: str) -> ExportedSpan:
    matching = [s for s in spans if s.name == name]
    assert len(matching) == 1, f"{name}: {len(matching)} spans"
    return matching[0]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_served_control_plane_exports_its_spans_over_otlp(rotel: Rotel, protocol: str) -> None:
    endpoint = rotel.grpc_endpoint if protocol == "grpc" else rotel.http_endpoint
    service = f"ocsb-test-{protocol.replace('/', '-')}"
    plane = PlaneProcess(short_tmp(), new_instance("otlp"), pool_size=0)
    plane.env = {k: v for k, v in plane.env.items() if not k.startswith("OTEL_")} | {
        "CONTROLPLANE_PROVIDER__TYPE": "local",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_SERVICE_NAME": service,
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    address = await plane.start()
    try:
        async with AsyncClient(address, plane.token()) as client:
            session = await client.create_session()
            outcome = await client.execute_tool(session.id, "bash", {"command": "echo over-otlp",
                                                                     "description": "Prints"}, call_id="call_otlp")
            assert outcome.result is not None
            assert outcome.result.output == "over-otlp\n"
            await client.delete_session(session.id)
        # Exported by the batch processor's own schedule (100 ms here), while the plane still runs.
        spans = await asyncio.to_thread(rotel.wait_for, "execute_tool bash")
    finally:
        await stop(plane)
        shutil.rmtree(plane.data_dir, ignore_errors=True)

    assert {s.service for s in spans} == {service}
    call = one(spans, "execute_tool bash")
    assert call.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "bash",
        "gen_ai.tool.call.id": "call_otlp",
        "sandbox.session.id": session.id,
        "sandbox.tenant": "default",
        "sandbox.id": session.sandbox_id,
        "sandbox.tool.source": "BUILTIN",
        "sandbox.tool.origin": "builtin",
        "sandbox.outcome": "ok",
        "sandbox.truncated": False,
        "sandbox.output.bytes": len(b"over-otlp\n"),
    }
    assert call.status_code == "STATUS_CODE_UNSET"
    server = one(spans, "/controlplane.v1.ToolService/ExecuteTool")
    assert server.kind == "SPAN_KIND_SERVER"
    assert call.parent_id == server.span_id
    assert call.trace_id == server.trace_id
    init = one(spans, "init_tool bash")
    assert init.parent_id == call.span_id
    assert call.start_ns <= init.start_ns <= init.end_ns <= call.end_ns
    created = one(spans, "create_session")
    acquired = one(spans, "acquire_sandbox")
    assert acquired.parent_id == created.span_id
    assert acquired.attributes["sandbox.pool.hit"] is False
    assert created.attributes["sandbox.session.id"] == session.id
