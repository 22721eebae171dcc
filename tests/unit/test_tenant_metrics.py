"""Per-tenant usage gauges (controlplane.telemetry.tenant_metrics): one point per tenant, with its name."""

from __future__ import annotations

from typing import Any

from tests.unit.test_telemetry import console_spans, run_python


def test_usage_gauges_carry_the_tenant() -> None:
    done = run_python("""
        from controlplane.core.tenants.quota import Usage
        from controlplane.telemetry import tenant_metrics
        handle = setup.configure()

        class Owner:
            usage = {"acme": Usage(sessions=2, cpu=1.5, memory_mb=512, disk_mb=2048, calls=3, subscriptions=1),
                     "beta": Usage(sessions=1)}

        owner = Owner()
        tenant_metrics.watch(owner, lambda o: o.usage)
        handle.shutdown()
    """, OTEL_METRICS_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    points: dict[str, dict[str, Any]] = {}
    for document in console_spans(done.stderr):
        for resource in document.get("resource_metrics", []):
            for scope in resource["scope_metrics"]:
                for metric in [m for m in scope["metrics"] if m["name"].startswith("ocsandbox.tenant.")]:
                    for point in metric["data"]["data_points"]:
                        points.setdefault(metric["name"], {})[point["attributes"]["sandbox.tenant"]] = point["value"]
    assert points["ocsandbox.tenant.sessions"] == {"acme": 2, "beta": 1}
    assert points["ocsandbox.tenant.cpu.reserved"] == {"acme": 1.5, "beta": 0.0}
    assert points["ocsandbox.tenant.memory.reserved"]["acme"] == 512
    assert points["ocsandbox.tenant.disk.reserved"]["acme"] == 2048
    assert points["ocsandbox.tenant.calls"] == {"acme": 3, "beta": 0}
    assert points["ocsandbox.tenant.subscriptions"]["acme"] == 1


def test_cpu_seconds_are_a_counter_per_tenant() -> None:
    done = run_python("""
        from controlplane.core.tenants.quota import Usage
        from controlplane.telemetry import tenant_metrics
        handle = setup.configure()

        class Owner:
            usage = {"acme": Usage(cpu_seconds=7.25), "beta": Usage()}

        owner = Owner()
        tenant_metrics.watch(owner, lambda o: o.usage)
        handle.shutdown()
    """, OTEL_METRICS_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = {}
    for document in console_spans(done.stderr):
        for resource in document.get("resource_metrics", []):
            for scope in resource["scope_metrics"]:
                for metric in [m for m in scope["metrics"] if m["name"] == "ocsandbox.tenant.cpu.seconds"]:
                    seen["monotonic"] = metric["data"]["is_monotonic"]
                    for point in metric["data"]["data_points"]:
                        seen[point["attributes"]["sandbox.tenant"]] = point["value"]
    assert seen == {"monotonic": True, "acme": 7.25, "beta": 0.0}
