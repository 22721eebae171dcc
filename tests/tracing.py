"""One process-wide SDK tracer provider for tests, recording every finished span in memory.

OpenTelemetry lets a process set its global tracer provider once, so every test that inspects
spans shares this one and clears it first.
"""

from __future__ import annotations

import threading

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_lock = threading.Lock()
_exporter: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """The shared in-memory exporter, installing the global SDK provider on first use."""
    global _exporter
    with _lock:
        if _exporter is None:
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            if trace.get_tracer_provider() is not provider:
                raise RuntimeError("another global tracer provider was installed before tests/tracing.py")
            _exporter = exporter
        return _exporter
