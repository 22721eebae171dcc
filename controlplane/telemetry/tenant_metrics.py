"""Per-tenant usage as OTel gauges, each point carrying the tenant (`sandbox.tenant`).

Callbacks run on the metric reader's thread, so they read a snapshot the control plane refreshes
(TenantAdmin, every REFRESH_S) instead of asking the store."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from controlplane.telemetry import attributes as a

METRICS: dict[str, tuple[str, str]] = {
    "sessions": ("ocsandbox.tenant.sessions", "Live top-level sessions of a tenant"),
    "cpu": ("ocsandbox.tenant.cpu.reserved", "CPUs reserved by a tenant's live sessions"),
    "memory_mb": ("ocsandbox.tenant.memory.reserved", "Memory (MiB) reserved by a tenant's live sessions"),
    "disk_mb": ("ocsandbox.tenant.disk.reserved", "Workspace disk (MiB) reserved by a tenant's live sessions"),
    "calls": ("ocsandbox.tenant.calls", "Running tool calls and Execs of a tenant"),
    "subscriptions": ("ocsandbox.tenant.subscriptions", "Open event subscriptions of a tenant"),
}
"""Usage field -> (metric name, description)."""

meter = metrics.get_meter(a.METER_NAME)
_sources: weakref.WeakKeyDictionary[Any, Callable[[Any], Mapping[str, Any]]] = weakref.WeakKeyDictionary()


def watch(owner: Any, read: Callable[[Any], Mapping[str, Any]]) -> None:
    """`read(owner)` gives {tenant: usage} (objects with the METRICS fields); owners are held weakly."""
    _sources[owner] = read


def _observer(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_: CallbackOptions) -> list[Observation]:
        points = []
        for owner, read in list(_sources.items()):
            for tenant, usage in read(owner).items():
                points.append(Observation(getattr(usage, field), {a.TENANT: tenant}))
        return points

    return observe


for _field, (_name, _description) in METRICS.items():
    meter.create_observable_gauge(_name, callbacks=[_observer(_field)], description=_description)
# Only ever grows (removed sandboxes' time is kept in the store), so a counter: rates come out right.
meter.create_observable_counter("ocsandbox.tenant.cpu.seconds", callbacks=[_observer("cpu_seconds")], unit="s",
                                description="CPU time used by a tenant's sandboxes, removed ones included")
