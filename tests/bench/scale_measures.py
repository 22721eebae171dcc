"""What `make bench-scale` (tests/bench/scale_bench.py) reads from the host: a container's cgroup CPU and memory
(cgroup v1 or v2), a process's CPU and RSS from /proc, the engine's own processes, the machine's load, and
where an idle sandbox's memory goes (per process, from /proc/PID/smaps_rollup read on the host).

Everything is read on the host, never through the sandbox, so a figure costs the sandbox nothing and cannot be
shaped by what runs inside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _v1(controller: str, cid: str) -> Path:
    default = CGROUP / controller / "docker" / cid
    if default.exists():
        return default
    # A sandbox under its tenant's parent (tenant_cgroups.py: /<plane's root>/<tenant>/<cid>), not the engine's own.
    return next(iter((CGROUP / controller).glob(f"*/*/{cid}")), default)


def _v2(cid: str) -> Path:
    return CGROUP / "system.slice" / f"docker-{cid}.scope"


def container_cpu_s(cid: str) -> float:
    """CPU time (user + system) of everything the container's cgroup ran, seconds; 0 once it is gone."""
    try:
        return int((_v1("cpuacct", cid) / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        pass
    try:
        for line in (_v2(cid) / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


@dataclass(frozen=True)
class CgroupMemory:
    anon_mib: float
    """Anonymous memory (v1 `rss`, v2 `anon`): the target's "cgroup rss"."""
    file_mib: float
    """Page cache charged to the container (v1 `cache`, v2 `file`)."""
    usage_mib: float
    """What the kernel charges in all (v1 memory.usage_in_bytes, v2 memory.current): kernel memory too."""


def container_memory(cid: str) -> CgroupMemory | None:
    """The container's memory from its cgroup; None when neither hierarchy has it."""
    for root, anon_key, file_key, usage in ((_v1("memory", cid), "rss", "cache", "memory.usage_in_bytes"),
                                            (_v2(cid), "anon", "file", "memory.current")):
        try:
            stat = dict(line.split() for line in (root / "memory.stat").read_text().splitlines())
            used = int((root / usage).read_text())
        except (OSError, ValueError):
            continue
        return CgroupMemory(int(stat[anon_key]) / 2**20, int(stat[file_key]) / 2**20, used / 2**20)
    return None


def container_pids(cid: str) -> list[int]:
    for path in (_v1("memory", cid) / "cgroup.procs", _v2(cid) / "cgroup.procs"):
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            continue
    return []


def process_cpu_s(pid: int) -> float:
    """User + system CPU of a live process (all its threads), seconds; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pids_named(*names: str) -> list[int]:
    """Host processes whose command name (comm) is one of `names` (the engine's dockerd and containerd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() in names:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def shim_pid(cid: str) -> int | None:
    """The container's shim: the parent of its first process (and of every `docker exec`'s process)."""
    pids = container_pids(cid)
    if not pids:
        return None
    try:
        return int(Path(f"/proc/{min(pids)}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def engine_cpu_s(cids: list[str]) -> float:
    """CPU of the engine's daemons (dockerd, containerd) and of these containers' shims: what a `docker exec`
    costs on the host besides its CLI and the container itself. The daemons serve every other user of the
    engine too, so on a shared machine this is an upper bound."""
    shims = [pid for pid in (shim_pid(cid) for cid in cids) if pid is not None]
    return sum(process_cpu_s(pid) for pid in [*pids_named("dockerd", "containerd"), *shims])


def load() -> str:
    return Path("/proc/loadavg").read_text().strip()


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    command: str
    threads: int
    anon_mib: float
    """Pss_Anon: the process's private anonymous memory (its heap, its modules' objects)."""
    file_mib: float
    """Pss_File: its share of mapped files (the interpreter, shared libraries)."""


def process_memory(pid: int) -> ProcessMemory | None:
    """One process's memory from smaps_rollup, read on the host (None: gone, or not readable)."""
    try:
        rollup = {line.split(":")[0]: int(line.split()[1]) for line in
                  Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]}
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
    except (OSError, ValueError, IndexError):
        return None
    return ProcessMemory(pid, command, threads, rollup.get("Pss_Anon", 0) / 1024, rollup.get("Pss_File", 0) / 1024)


def container_breakdown(cid: str) -> list[ProcessMemory]:
    return [m for m in (process_memory(pid) for pid in container_pids(cid)) if m is not None]
