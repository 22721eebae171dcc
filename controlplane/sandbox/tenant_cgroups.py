"""Each tenant's sandboxes under a cgroup parent of its own, all parents of equal CPU weight.

Why: the kernel shares CPU between sibling cgroups by weight. With every container a sibling under the engine's
`docker` group, a tenant with four busy sandboxes got four shares of the host's CPUs to another tenant's one: B's
`bash` p99 went to 3.5-5.3x its own alone while A flooded (docs/performance.md, 2026-11-28). Under a parent per
tenant, siblings of equal weight, the four share one tenant's part.

How, on the engine's cgroupfs driver (the one this engine runs; `docker info`): a container created with
`cgroup_parent=/ocsb-<instance>/t-<hash of the tenant>` gets `<parent>/<id>` in every hierarchy. The plane creates
the parent's CPU groups itself first, with the default weight written out (cgroup v1 `cpu.shares` 1024, v2
`cpu.weight` 100, what the engine's own `docker` group has), and removes the parent in every hierarchy once no
sandbox of this plane is left in it. The tenants' parents sit in one group per instance: two planes never share or
remove each other's parents, and a plane's sandboxes together weigh what the engine's other containers (its `docker`
group) do, however many tenants it serves. Under the systemd driver a parent would be a slice that systemd owns: not
done (`provider.tenant_cpu_weight` unset leaves it off there with a warning; true refuses to start).

Pooled sandboxes are made before any tenant asks: they start under the instance's pool parent, and a claim moves
the container's processes into `<tenant parent>/<id>` of the CPU hierarchy, with the container's own CPU limit
copied (the move takes about a millisecond: a few file writes). Only the CPU hierarchy moves: under cgroup v1 each
controller is a tree of its own, so the memory, pids, devices and freezer groups that confine the container stay
where the engine made them, and the engine still stops it through them. Under cgroup v2 a process moves in every
controller at once and would leave its memory and device limits behind, so there a pooled sandbox stays under the
pool's parent (docs/security.md says so). Per-tenant pools were the alternative: as many idle containers per
tenant as the pool's size, for what a move does in a millisecond.

Verified like the other hardening (fail closed): the engine must report the parent asked for (confinement.py),
and once started, the container's first process must be in it as seen from the host's /proc; a claim's move must
leave no process behind and the copy must have the container's limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controlplane.core.seam.provider import Sandbox
from controlplane.errors import ConfigError, HardeningError

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
V1_SHARES = "1024"
V2_WEIGHT = "100"
"""The kernel's default weights, which the engine's own `docker` group has: a tenant weighs what it does."""
CPU_LIMIT_FILES = ("cpu.shares", "cpu.cfs_period_us", "cpu.cfs_quota_us")
"""What a moved container's CPU group gets from its old one (the period first: a quota is checked against it)."""
POOL = "pool"
MOVE_ROUNDS = 20
"""A process forking while it moves could leave a child behind: the move repeats until the old group is empty."""
RELEASE_WAIT_S = 2.0
"""How long a release waits for a removed container's last processes to leave its moved group."""


def cgroup_mounts(mountinfo: Path = MOUNTINFO) -> list[tuple[Path, str, set[str]]]:
    """Every cgroup hierarchy mounted here: (mount point, "cgroup" or "cgroup2", its v1 controllers)."""
    mounts = []
    for line in mountinfo.read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if len(parts) > 4 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            mounts.append((Path(parts[4]), rest[0], set(rest[2].split(","))))
    return mounts


def instance_group(instance: str) -> str:
    """The group all of an instance's parents are in."""
    return f"ocsb-{instance}"


def group_name(instance: str, tenant: str) -> str:
    """The parent's path under the hierarchy's root, unique per (instance, tenant) whatever the tenant's name
    holds. A hash, not the name: a sandbox reads its own group's path in /proc/self/cgroup, and the model in it
    need not learn what its tenant is called."""
    if not tenant:
        return f"{instance_group(instance)}/{POOL}"
    return f"{instance_group(instance)}/t-{hashlib.sha256(tenant.encode()).hexdigest()[:16]}"


class TenantCgroups:
    def __init__(self, instance: str, wanted: bool | None, mountinfo: Path = MOUNTINFO) -> None:
        self._instance = instance
        self._wanted = wanted
        self._mountinfo = mountinfo
        self.enabled = False
        self._cpu: Path | None = None
        """The CPU hierarchy's mount point (v1: the one with the cpu controller; v2: the unified one)."""
        self._v2 = False
        self._all: list[Path] = []
        self._members: dict[str, str] = {}
        """This plane's sandboxes in each parent (sandbox id -> group name): a parent goes when none is left."""
        self._moved: dict[str, Path] = {}
        """Claimed pooled sandboxes' moved CPU groups, removed after their containers."""
        self._lock = threading.Lock()

    # -- start ----------------------------------------------------------------------------------

    def start(self, client: Any) -> None:
        """Decides from the engine's `docker info` whether parents are used, and removes this instance's empty
        parents a previous run left. ConfigError when they are required (`tenant_cpu_weight = true`) and cannot be."""
        if self._wanted is False:
            return
        reason = self._unusable(client.info())
        if reason is not None:
            if self._wanted:
                raise ConfigError(f"provider.tenant_cpu_weight is true but {reason}")
            log.warning("tenant CPU weights are off: %s (provider.tenant_cpu_weight)", reason)
            return
        self.enabled = True
        self._sweep()

    def _unusable(self, info: dict[str, Any]) -> str | None:
        driver, version = info.get("CgroupDriver"), str(info.get("CgroupVersion") or "1")
        if driver != "cgroupfs":
            return f"the engine's cgroup driver is {driver!r}, not 'cgroupfs'"
        mounts = cgroup_mounts(self._mountinfo)
        if version == "2":
            unified = [m for m, kind, _ in mounts if kind == "cgroup2"]
            self._cpu, self._v2 = (unified[0] if unified else None), True
        else:
            self._cpu = next((m for m, kind, ctl in mounts if kind == "cgroup" and "cpu" in ctl), None)
        self._all = [m for m, _, _ in mounts]
        if self._cpu is None:
            return "no CPU cgroup hierarchy is mounted on this host"
        if not os.access(self._cpu, os.W_OK):
            return f"the control plane cannot write {self._cpu} (it must run as root on the engine's host)"
        return None

    # -- creation -------------------------------------------------------------------------------

    def parent(self, tenant: str) -> str:
        return "/" + group_name(self._instance, tenant)

    def join(self, sandbox_id: str, tenant: str) -> dict[str, Any]:
        """The container-create options that put `sandbox_id`'s container under `tenant`'s parent ("": the
        pool's), the parent made first with its weight."""
        if not self.enabled:
            return {}
        name = group_name(self._instance, tenant)
        with self._lock:
            self._members[sandbox_id] = name  # before the engine makes children: no sweep removes it meanwhile
            self._ensure(name)
        return {"cgroup_parent": "/" + name}

    def _ensure(self, name: str) -> None:
        assert self._cpu is not None
        group = self._cpu / name
        try:
            for level in (group.parent, group):
                level.mkdir(exist_ok=True)
                if self._v2:
                    (level / "cpu.weight").write_text(V2_WEIGHT)
                else:
                    (level / "cpu.shares").write_text(V1_SHARES)
        except OSError as exc:
            raise HardeningError(f"sandbox hardening could not be applied: tenant CPU group {group}: {exc}") from exc

    # -- claims ---------------------------------------------------------------------------------

    def claim(self, sandbox: Sandbox, tenant: str) -> None:
        """Moves a pooled sandbox's container into `tenant`'s parent (cgroup v1's CPU hierarchy only; see the
        module's docstring). HardeningError when a process stayed behind or the limit did not carry over."""
        sandbox_id, container_id = sandbox.id, str(sandbox.details.get("container_id", ""))
        if not self.enabled or self._v2 or not tenant or not container_id or "/" in container_id:
            return
        assert self._cpu is not None
        name = group_name(self._instance, tenant)
        new = self._cpu / name / container_id
        # Under the pool's parent, or under the engine's own when pooled by a run before this was on.
        pooled = self._cpu / group_name(self._instance, "") / container_id
        old = next((g for g in (pooled, *self._cpu.glob(f"*/{container_id}")) if g != new and g.is_dir()), None)
        if old is None:
            raise HardeningError(f"sandbox hardening could not be applied: no CPU group of {container_id[:12]}")
        with self._lock:
            self._members[sandbox_id] = name
            self._ensure(name)
            try:
                new.mkdir(exist_ok=True)
                self._moved[sandbox_id] = new
                limits = {f: (old / f).read_text().strip() for f in CPU_LIMIT_FILES if (old / f).exists()}
                for file, value in limits.items():
                    (new / file).write_text(value)
                left = _move_all(old, new)
                copied = {f: (new / f).read_text().strip() for f in limits}
            except OSError as exc:
                raise HardeningError(f"sandbox hardening could not be applied: moving {container_id[:12]} into "
                                     f"its tenant's CPU group: {exc}") from exc
        if left or copied != limits:
            raise HardeningError(f"sandbox hardening could not be applied: moving {container_id[:12]} into its "
                                 f"tenant's CPU group left {len(left)} processes behind, limits {copied} of {limits}")

    # -- removal --------------------------------------------------------------------------------

    def release(self, sandbox_id: str) -> None:
        """After `sandbox_id`'s container is removed: its moved group goes, then every parent of this instance
        that no sandbox of this plane is in and whose containers are all gone, in every hierarchy."""
        if not self.enabled:
            return
        with self._lock:
            self._members.pop(sandbox_id, None)
            moved = self._moved.pop(sandbox_id, None)
        if moved is not None:
            deadline = time.monotonic() + RELEASE_WAIT_S
            while not _rmdir(moved) and moved.exists() and time.monotonic() < deadline:
                time.sleep(0.02)  # the container's last processes are still exiting
        self._sweep()

    def _sweep(self) -> None:
        top = instance_group(self._instance)
        with self._lock:
            busy = set(self._members.values())
            for mount in self._all:
                for group in _children(mount / top):
                    if f"{top}/{group.name}" in busy:
                        continue
                    if mount == self._cpu:
                        for child in _children(group):
                            _rmdir(child)  # moved groups of containers that are gone (a previous run's too)
                    _rmdir(group)
                _rmdir(mount / top)

    def parents(self) -> list[Path]:
        """This instance's parents in the CPU hierarchy now (tests and the bench look at them)."""
        return [] if self._cpu is None else _children(self._cpu / instance_group(self._instance))


def parent_problems(attrs: dict[str, Any], wanted: str | None) -> list[str]:
    """What the engine did not apply of the parent asked for (`wanted`, None: none asked), from the created
    container's inspect data."""
    if not wanted:
        return []
    found = str((attrs.get("HostConfig") or {}).get("CgroupParent") or "")
    return [] if found == wanted else [f"the container's cgroup parent is {found!r}, not {wanted!r}"]


def process_problem(attrs: dict[str, Any]) -> str | None:
    """Whether the started container's first process is outside the parent the engine reports, read from the
    host's /proc (so nothing in the sandbox answers for it). None: it is inside, or no parent was asked for."""
    wanted = str((attrs.get("HostConfig") or {}).get("CgroupParent") or "")
    if not wanted:
        return None
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    try:
        path = cpu_group_of(pid)
    except (OSError, ValueError):
        return "the container's CPU group could not be read (the control plane must run on the engine's host)"
    if not path.startswith(wanted.rstrip("/") + "/"):
        return f"the container's processes are in CPU group {path!r}, not under {wanted!r}"
    return None


def cpu_group_of(pid: int) -> str:
    """A process's group in the CPU hierarchy (cgroup v1's `cpu` line, else v2's unified `0::` line)."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    for _, controllers, path in lines:
        if "cpu" in controllers.split(","):
            return path
    for number, _, path in lines:
        if number == "0":
            return path
    raise ValueError(f"no CPU group for process {pid}")


def _children(directory: Path) -> list[Path]:
    with contextlib.suppress(OSError):
        return [p for p in directory.iterdir() if p.is_dir()]
    return []


def _rmdir(group: Path) -> bool:
    """Removes an empty cgroup; False while it still has processes or children (EBUSY) or is gone."""
    try:
        group.rmdir()
    except OSError:
        return False
    return True


def _move_all(old: Path, new: Path) -> list[str]:
    """Moves every process of `old` into `new`; what is left after MOVE_ROUNDS (processes forking meanwhile)."""
    left: list[str] = []
    for _ in range(MOVE_ROUNDS):
        left = (old / "cgroup.procs").read_text().split()
        if not left:
            return []
        _write_pids(new / "cgroup.procs", left)
    return left


def _write_pids(procs: Path, pids: Iterable[str]) -> None:
    for pid in pids:
        try:
            procs.write_text(pid)
        except ProcessLookupError:
            continue  # it exited meanwhile
