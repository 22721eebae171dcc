"""The host's capacity for admission (core/sessions/capacity), from `[host]` or from the machine: its CPUs,
memory and free disk, its identity in the store's reservations, and the ledger built from them."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from controlplane.config import Settings
from controlplane.core.sessions.capacity import DiskRule, HostCapacity, HostLedger, Reservation, ReservationBook
from controlplane.errors import SandboxError
from controlplane.sandbox.runtime_pools import pooled_sandboxes


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


def free_disk_mb(path: Path) -> int:
    """What an unprivileged writer may still use on `path`'s filesystem (the root-only reserve left out)."""
    st = os.statvfs(path)
    return (st.f_bavail * st.f_frsize) >> 20


def disk_need_mb(image_mb: int) -> int:
    """What a new workspace image of `image_mb` takes on the host soon, whatever the session writes.

    The image is sparse (sandbox/workspace_disk.py: mkfs.ext4 with lazy inode table and journal init), so
    at first only the superblocks, group descriptors and bitmaps are on the host: measured 1.2 MiB for a
    2 GiB image, 4.3 MiB for 8 GiB (a thousandth, rounded up). The inode tables stay sparse (the loop
    device zeroes them by punching holes), but the journal, 64 MiB for 2 GiB (mke2fs gives from a 64th
    to a 32nd of the size, at most 1 GiB), fills as the session writes: 200 small synced writes took
    9 MiB. The journal is what every session will take on the host as soon as it writes at all, so it is
    counted in full: a 32nd, at most 1 GiB. What the session writes into its files is its own (bounded by
    the image's size and its tenant's disk quota), and is seen in the free space once written."""
    if image_mb <= 0:
        return 0
    return -(-image_mb // 1024) + min(-(-image_mb // 32), 1024)


def host_id(settings: Settings) -> str:
    """The host's name in the store's reservations: `host.id`, else what every plane on it sees alike."""
    if settings.host.id:
        return settings.host.id
    provider = settings.provider
    if provider.type in ("docker", "swarm"):
        import docker  # imported here: the local provider runs without an engine

        try:
            client = docker.DockerClient(base_url=provider.base_url) if provider.base_url else docker.from_env()
            try:
                info = client.info()
            finally:
                client.close()
        except docker.errors.DockerException as exc:
            raise SandboxError(
                f"host admission: cannot read the Docker engine's ID to name the host ({exc}); start the engine, "
                "or set host.id"
            ) from exc
        cluster = (info.get("Swarm") or {}).get("Cluster") or {}
        if provider.type == "swarm" and cluster.get("ID"):
            return "swarm:" + str(cluster["ID"])
        return "engine:" + str(info["ID"])
    for source in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        with contextlib.suppress(OSError):
            machine = source.read_text().strip()
            if machine:
                return "machine:" + machine
    return "hostname:" + socket.gethostname()


def disk_rule(settings: Settings) -> DiskRule | None:
    """Swarm sandboxes keep their workspaces on their nodes (tmpfs): this host's disk bounds none of them."""
    if settings.provider.type == "swarm":
        return None
    data_dir = settings.data_dir
    # Only the Docker provider makes a workspace image in the data dir; the local provider's workspace is a
    # plain dir there, which takes what the session writes and nothing before.
    image_mb = disk_need_mb(settings.resources.disk_mb) if settings.provider.type == "docker" else 0
    return DiskRule(lambda: free_disk_mb(data_dir), settings.host.disk_reserve_mb, image_mb)


def ledger(settings: Settings, book: ReservationBook | None = None, host: str = "host") -> HostLedger:
    r = settings.resources.reserve
    return HostLedger(capacity(settings), Reservation(r.cpu, r.memory_mb), pooled=pooled_sandboxes(settings), book=book,
                      host=host, plane=settings.instance, lease_s=settings.host.lease_s, disk=disk_rule(settings))
