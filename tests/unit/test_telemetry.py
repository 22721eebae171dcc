"""controlplane.telemetry: exporter choice from OTEL_*, SDK setup (in fresh processes, since a process
installs its global providers once), and how a call's span ends."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from controlplane.core.calls.tool import ToolError
from controlplane.errors import ConfigError
from controlplane.telemetry import spans
from controlplane.telemetry.setup import GRPC, HTTP, chosen_exporters, chosen_protocol
from tests.tracing import memory_exporter

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("env", "signal", "expected"), [
    ({}, "TRACES", []),
    ({"OTEL_SERVICE_NAME": "x"}, "TRACES", []),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "TRACES", ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "METRICS", ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "TRACES", ["otlp"]),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "METRICS", []),
    ({"OTEL_TRACES_EXPORTER": "console"}, "TRACES", ["console"]),
    ({"OTEL_TRACES_EXPORTER": " Console , otlp,console"}, "TRACES", ["console", "otlp"]),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, "TRACES", []),
    ({"OTEL_TRACES_EXPORTER": "otlp,none"}, "TRACES", []),
    ({"OTEL_TRACES_EXPORTER": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, "TRACES", ["otlp"]),
    ({"OTEL_METRICS_EXPORTER": "console"}, "TRACES", []),
    ({"OTEL_METRICS_EXPORTER": "console"}, "METRICS", ["console"]),
])
def test_exporters_are_chosen_only_by_the_environment(env: dict[str, str], signal: str, expected: list[str]) -> None:
    assert chosen_exporters(env, signal) == expected


def test_an_unknown_exporter_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER: unsupported exporter 'zipkin'"):
        chosen_exporters({"OTEL_TRACES_EXPORTER": "otlp,zipkin"}, "TRACES")


@pytest.mark.parametrize(("env", "expected"), [
    ({}, HTTP),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, GRPC),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, HTTP),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " GRPC "}, GRPC),
])
def test_protocol(env: dict[str, str], expected: str) -> None:
    assert chosen_protocol(env, "TRACES") == expected


def test_http_json_is_refused() -> None:
    with pytest.raises(ConfigError, match="unsupported protocol 'http/json'"):
        chosen_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "TRACES")


# -- configure() in a fresh interpreter ---------------------------------------------------------

PRELUDE = """
import asyncio, json, sys
from opentelemetry import trace
from controlplane.telemetry import setup, spans
"""


def run_python(code: str, prelude: str = PRELUDE, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=REPO, env={**clean, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )


def console_spans(stderr: str) -> list[dict[str, Any]]:
    """The JSON documents ConsoleSpanExporter printed (one per span, pretty-printed)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := stderr.find("{\n", at)) != -1:
        document, at = decoder.raw_decode(stderr, start)
        found.append(document)
    return found


SPAN_AND_SHUTDOWN = """
handle = setup.configure()
with spans.execute_tool("bash", "call_1", "ses_1", "acme", "sbx_1", "BUILTIN", "builtin") as call:
    call.completed("héllo", False)
print(json.dumps({"exporters": handle.exporters, "provider": type(trace.get_tracer_provider()).__name__}))
handle.shutdown()
"""


def test_nothing_is_installed_or_exported_without_configuration() -> None:
    done = run_python(SPAN_AND_SHUTDOWN)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"exporters": [], "provider": "ProxyTracerProvider"}
    assert done.stderr == ""


def test_console_exporter_prints_spans_with_the_default_service_name() -> None:
    done = run_python(SPAN_AND_SHUTDOWN, OTEL_TRACES_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"exporters": ["traces:console"], "provider": "TracerProvider"}
    [span] = console_spans(done.stderr)
    assert span["name"] == "execute_tool bash"
    assert span["resource"]["attributes"]["service.name"] == "ocsandbox-controlplane"
    assert span["attributes"]["sandbox.output.bytes"] == len("héllo".encode())
    assert span["attributes"]["sandbox.outcome"] == "ok"
    assert span["status"] == {"status_code": "UNSET"}


def test_service_name_and_sampler_come_from_the_environment() -> None:
    done = run_python(SPAN_AND_SHUTDOWN, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="cp-east")
    [span] = console_spans(done.stderr)
    assert span["resource"]["attributes"]["service.name"] == "cp-east"
    done = run_python(SPAN_AND_SHUTDOWN, OTEL_TRACES_EXPORTER="console", OTEL_TRACES_SAMPLER="always_off")
    assert done.returncode == 0, done.stderr
    assert console_spans(done.stderr) == []
    done = run_python(
        SPAN_AND_SHUTDOWN, OTEL_TRACES_EXPORTER="console", OTEL_TRACES_SAMPLER="traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0",
    )
    assert console_spans(done.stderr) == []


def test_sdk_disabled_wins_over_any_exporter() -> None:
    done = run_python(SPAN_AND_SHUTDOWN, OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true",
                      OTEL_METRICS_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"exporters": [], "provider": "ProxyTracerProvider"}
    assert done.stderr == ""


def test_a_provider_already_installed_is_kept() -> None:
    done = run_python("""
        from opentelemetry.sdk.trace import TracerProvider
        mine = TracerProvider()
        trace.set_tracer_provider(mine)
        handle = setup.configure()
        print(json.dumps([handle.tracing, trace.get_tracer_provider() is mine, setup.tracing_active()]))
    """, OTEL_TRACES_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True, True]


def test_console_metrics_carry_tool_duration_pool_and_session_instruments() -> None:
    done = run_python("""
        handle = setup.configure()

        class Owner:
            pass

        owner = Owner()
        spans.pool_depth.watch(owner, lambda _: 3)
        spans.active_sessions.watch(owner, lambda _: 2)
        spans.pool_hits.add(1)
        spans.pool_misses.add(2)
        with spans.execute_tool("read", "c", "s", "t", "x", "BUILTIN", "builtin"):
            pass
        with spans.init_tool("glob", "BUILTIN", "builtin"):
            pass
        handle.shutdown()
    """, OTEL_METRICS_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    text = done.stderr
    points: dict[str, list[dict[str, Any]]] = {}
    for document in console_spans(text):
        for resource in document.get("resource_metrics", []):
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    points.setdefault(metric["name"], []).extend(metric["data"]["data_points"])
    assert points["ocsandbox.pool.depth"][-1]["value"] == 3
    assert points["ocsandbox.sessions.active"][-1]["value"] == 2
    assert points["ocsandbox.pool.hits"][-1]["value"] == 1
    assert points["ocsandbox.pool.misses"][-1]["value"] == 2
    [duration] = points["ocsandbox.tool.duration"][-1:]
    assert duration["attributes"] == {"gen_ai.tool.name": "read", "sandbox.outcome": "ok", "sandbox.tenant": "t"}
    assert duration["count"] == 1
    [init] = points["ocsandbox.tool.init.duration"][-1:]
    assert init["attributes"] == {"gen_ai.tool.name": "glob", "sandbox.tool.source": "BUILTIN"}


def test_domain_code_never_imports_the_sdk() -> None:
    done = run_python("""
        import json, sys
        import controlplane.core.calls.executor, controlplane.core.sessions.manager, controlplane.core.permissions.asks
        import controlplane.core.calls.hooks, controlplane.telemetry.spans
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "grpc")))))
    """, prelude="")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    for path in (REPO / "controlplane" / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("opentelemetry.sdk", "controlplane.telemetry.setup")), path


# -- how a call's span ends (in this process, on the tests' in-memory provider) ------------------


def last_span(name: str) -> ReadableSpan:
    return [s for s in memory_exporter().get_finished_spans() if s.name == name][-1]


def test_a_tool_error_caused_by_a_timeout_is_outcome_timeout() -> None:
    memory_exporter().clear()
    with spans.execute_tool("webfetch", "c1", "s", "t", "x", "BUILTIN", "builtin") as call:
        try:
            try:
                raise TimeoutError
            except TimeoutError as exc:
                raise ToolError("Request timed out") from exc
        except ToolError as error:
            call.failed("error", error)
    span = last_span("execute_tool webfetch")
    assert span.attributes is not None
    assert span.attributes["sandbox.outcome"] == "timeout"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "Request timed out"
    assert [e.name for e in span.events] == ["exception"]


def test_a_task_cancelled_mid_call_ends_its_span_cancelled() -> None:
    memory_exporter().clear()

    async def cancelled_call() -> None:
        with spans.execute_tool("bash", "c2", "s", "t", "x", "BUILTIN", "builtin"):
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(cancelled_call())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    span = last_span("execute_tool bash")
    assert span.attributes is not None
    assert span.attributes["sandbox.outcome"] == "cancelled"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "cancelled"
    assert [e.name for e in span.events] == ["cancelled"]


def test_an_unexpected_exception_is_recorded_and_reraised() -> None:
    memory_exporter().clear()
    with pytest.raises(KeyError), spans.execute_tool("grep", "c3", "s", "t", "x", "BUILTIN", "builtin"):
        raise KeyError("boom")
    span = last_span("execute_tool grep")
    assert span.attributes is not None
    assert span.attributes["sandbox.outcome"] == "error"
    assert span.status.description == "'boom'"
    [event] = span.events
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "KeyError"


def test_a_tool_initialised_in_the_sandbox_gets_no_second_init_span() -> None:
    memory_exporter().clear()
    with spans.listed_init("slow", "CUSTOM", ".opencode/tool/slow.ts", 1500.0):
        pass
    with spans.listed_init("glob", "BUILTIN", "builtin", None):
        pass
    assert [s.name for s in memory_exporter().get_finished_spans()] == ["init_tool glob"]
