"""OpenTelemetry for the control plane: shared attribute names, SDK setup from OTEL_* env, metrics."""
