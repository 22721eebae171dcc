"""The host's capacity for admission (core/sessions/capacity), from `[host]` or from the machine."""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.config import Settings
from controlplane.core.sessions.capacity import HostCapacity, HostLedger, Reservation


def machine_cpus() -> float:
    """CPUs this process may run on (a cpuset narrows os.cpu_count())."""
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return float(os.cpu_count() or 1)


def machine_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def capacity(settings: Settings) -> HostCapacity:
    """`[host]` where set; otherwise the machine's CPUs and its memory less `host.memory_reserve_mb`.
    A swarm's sandboxes run on other nodes: there, what `[host]` leaves unset is not bounded here."""
    h = settings.host
    if settings.provider.type == "swarm":
        return HostCapacity(h.cpu if h.cpu is not None else float("inf"),
                            h.memory_mb if h.memory_mb is not None else 1 << 62)
    cpu = h.cpu if h.cpu is not None else machine_cpus()
    memory = h.memory_mb if h.memory_mb is not None else max(machine_memory_mb() - h.memory_reserve_mb, 0)
    return HostCapacity(cpu, memory)


def ledger(settings: Settings) -> HostLedger:
    r = settings.resources.reserve
    return HostLedger(capacity(settings), Reservation(r.cpu, r.memory_mb), pooled=settings.pool.size)
