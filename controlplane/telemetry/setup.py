"""Installs the OpenTelemetry SDK from the standard OTEL_* environment, and nothing without it.

Traces are exported when OTEL_TRACES_EXPORTER names exporters (`otlp`, `console`, comma-separated)
or, with it unset, when an OTLP endpoint is set; metrics likewise with OTEL_METRICS_EXPORTER.
Everything else (endpoint, headers, protocol, sampler, service name, intervals) is read by the SDK
and the exporters from the same environment. A provider already installed is never replaced.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter

from controlplane.errors import ConfigError

log = logging.getLogger(__name__)
DEFAULT_SERVICE_NAME = "ocsandbox-controlplane"
GRPC, HTTP = "grpc", "http/protobuf"


@dataclass
class Telemetry:
    """What `configure()` installed; `shutdown()` flushes and stops only that."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    exporters: list[str] = field(default_factory=list)
    """What was set up, e.g. `traces:otlp(grpc)`, `traces:console`, `metrics:otlp(http/protobuf)`."""

    @property
    def tracing(self) -> bool:
        return self.tracer_provider is not None

    def flush(self, timeout_ms: int = 5000) -> bool:
        ok = True
        if self.tracer_provider is not None:
            ok = self.tracer_provider.force_flush(timeout_ms) and ok
        if self.meter_provider is not None:
            ok = self.meter_provider.force_flush(timeout_ms) and ok
        return ok

    def shutdown(self) -> None:
        """Blocking (exports what is buffered): call it from a thread in async code."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
            self.tracer_provider = None
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
            self.meter_provider = None


def configure() -> Telemetry:
    """Installs the global tracer and meter providers the environment asks for (none by default)."""
    env = os.environ
    handle = Telemetry()
    if _flag(env, "OTEL_SDK_DISABLED"):
        return handle
    trace_exporters = chosen_exporters(env, "TRACES")
    if trace_exporters and not _sdk_installed(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(resource=_resource())
        for name in trace_exporters:
            if name == "console":
                provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
            else:
                protocol = chosen_protocol(env, "TRACES")
                provider.add_span_processor(BatchSpanProcessor(_otlp_span_exporter(protocol)))
                name = f"otlp({protocol})"
            handle.exporters.append(f"traces:{name}")
        trace.set_tracer_provider(provider)
        handle.tracer_provider = provider
    metric_exporters = chosen_exporters(env, "METRICS")
    if metric_exporters and not _sdk_installed(metrics.get_meter_provider(), MeterProvider):
        readers = []
        for name in metric_exporters:
            exporter: MetricExporter
            if name == "console":
                exporter = ConsoleMetricExporter(out=sys.stderr)
            else:
                protocol = chosen_protocol(env, "METRICS")
                exporter = _otlp_metric_exporter(protocol)
                name = f"otlp({protocol})"
            readers.append(PeriodicExportingMetricReader(exporter))
            handle.exporters.append(f"metrics:{name}")
        meter_provider = MeterProvider(resource=_resource(), metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        handle.meter_provider = meter_provider
    if handle.exporters:
        log.info("OpenTelemetry export: %s", ", ".join(handle.exporters))
    return handle


def tracing_active() -> bool:
    """Whether spans can be recorded at all (an SDK tracer provider is installed, here or by a test)."""
    return _sdk_installed(trace.get_tracer_provider(), TracerProvider)


def _sdk_installed(provider: object, sdk_type: type) -> bool:
    return isinstance(provider, sdk_type)


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() == "true"


def chosen_exporters(env: Mapping[str, str], signal: str) -> list[str]:
    """The exporters OTEL_{signal}_EXPORTER names; unset means `otlp` when an OTLP endpoint is set."""
    given = env.get(f"OTEL_{signal}_EXPORTER")
    if given is None or not given.strip():
        configured = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        return ["otlp"] if configured else []
    names = [n.strip().lower() for n in given.split(",") if n.strip()]
    if "none" in names:
        return []
    unknown = [n for n in names if n not in ("otlp", "console")]
    if unknown:
        raise ConfigError(f"OTEL_{signal}_EXPORTER: unsupported exporter {unknown[0]!r} (use otlp, console or none)")
    return list(dict.fromkeys(names))


def chosen_protocol(env: Mapping[str, str], signal: str) -> str:
    protocol = (env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or HTTP)
    protocol = protocol.strip().lower()
    if protocol not in (GRPC, HTTP):
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol {protocol!r} (use grpc or http/protobuf)")
    return protocol


def _otlp_span_exporter(protocol: str) -> SpanExporter:
    # The exporters read endpoint, headers, timeout, compression and certificates from OTEL_* themselves.
    if protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    return HttpSpanExporter()


def _otlp_metric_exporter(protocol: str) -> MetricExporter:
    if protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

    return HttpMetricExporter()


def _resource() -> Resource:
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource
