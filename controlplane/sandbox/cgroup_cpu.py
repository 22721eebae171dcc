"""A container's CPU time, read from its cgroup on this host: what a tenant's sessions have used (GetUsage).

Docker puts each container in a cgroup named after its id; which file holds the total depends on the cgroup
version and on the engine's cgroup driver (cgroupfs: `docker/<id>`, systemd: `system.slice/docker-<id>.scope`).
The kernel's own counter is exact and costs a file read, where the engine's stats API costs a round trip.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_V1_DIRS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_GROUPS = ("docker/{id}", "system.slice/docker-{id}.scope")


def cpu_seconds(container_id: str, root: Path = ROOT) -> float | None:
    """CPU time the container's processes have used so far (user and system), or None when no cgroup of it
    is found here (the engine runs on another host, or the container is gone)."""
    if not container_id or "/" in container_id or container_id.startswith("."):
        return None
    for group in _GROUPS:
        name = group.format(id=container_id)
        for v1 in _V1_DIRS:  # cgroup v1: nanoseconds
            try:
                return int((root / v1 / name / "cpuacct.usage").read_text()) / 1e9
            except (OSError, ValueError):
                pass
        try:  # cgroup v2: cpu.stat's usage_usec, microseconds
            for line in (root / name / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
    return _under_tenant_parents(container_id, root)


def _under_tenant_parents(container_id: str, root: Path) -> float | None:
    """A container under a tenant's or the pool's parent (tenant_cgroups.py): `ocsb-<instance>/<name>/<id>`. A
    claimed pooled container's CPU group moved, so where cpu and cpuacct share a hierarchy its time is in two
    groups (before and after the claim): the sum."""
    found: list[float] = []
    for v1 in _V1_DIRS:
        for usage in (root / v1).glob(f"ocsb-*/*/{container_id}/cpuacct.usage"):
            try:
                found.append(int(usage.read_text()) / 1e9)
            except (OSError, ValueError):
                pass
    for stat in root.glob(f"ocsb-*/*/{container_id}/cpu.stat"):
        try:
            lines = stat.read_text().splitlines()
        except OSError:
            continue
        found += [int(v) / 1e6 for k, _, v in (line.partition(" ") for line in lines) if k == "usage_usec"]
    return sum(found) if found else None
