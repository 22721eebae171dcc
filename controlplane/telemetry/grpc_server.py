"""The gRPC server span of every public RPC, continuing a client's `traceparent` metadata."""

from __future__ import annotations

import grpc
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from controlplane.telemetry.setup import tracing_active

UNTRACED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.")


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """The tracing interceptor (to run before any other), or none when no SDK records spans."""
    if not tracing_active():
        return []
    untraced = filters.any_of(*(filters.service_prefix(prefix) for prefix in UNTRACED_SERVICES))
    interceptor: grpc.aio.ServerInterceptor = aio_server_interceptor(  # type: ignore[no-untyped-call]
        filter_=filters.negate(untraced),
    )
    return [interceptor]
