"""What keeps one sandbox from seeing or exhausting another's kernel state: masked paths and the syscall filter.

Two attacks from a `bash` call reached other tenants through the shared kernel:
- `/sys/block/loop*/loop/backing_file` named every session's disk image (`DATA_DIR/disks/<sandbox>.img`,
  other control planes' data dirs too) and `/sys/block/loopN/stat`, `/proc/diskstats` showed another
  tenant's writes live. Docker's `MaskedPaths` covers a path with an empty read-only tmpfs (a directory)
  or /dev/null (a file); we give Docker's own list plus every view of block devices we found readable.
- A loop of `io_setup` took all of the host's AIO contexts (`fs.aio-max-nr` is host-wide), so the call
  failed in every other sandbox and for root on the host. The engine's default seccomp profile allows it.
  The agent adds a filter of its own on top of that profile (seccomp filters stack: a call passes only if
  every filter lets it): `SYSCALL_DENY` below, installed before any tool runs (sandbox_agent/syscall_filter.py).
  Stacking keeps the engine's default profile as the engine ships it instead of a copy in this repository
  that would drift from it, and works where an engine takes no seccomp option (a Swarm service).

Both are checked after creation like the other hardening options (`problems`), and fail closed.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docker.types import Mount

from controlplane.errors import HardeningError
from controlplane.sandbox import tenant_cgroups
from controlplane.sandbox.layout import ENV_SYSCALL_DENY, ENV_TOOL_UID, LABEL_TOOL_UID

CLONE_NAMESPACES = "clone:namespaces"
"""The agent's name for `clone` with a namespace flag (sandbox_agent.syscall_filter.CLONE_NAMESPACES)."""

DOCKER_MASKED = [
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
]
"""The engine's default list: setting `MaskedPaths` replaces it, so it is repeated here."""
BLOCK_DEVICE_VIEWS = [
    "/sys/block", "/sys/class/block", "/sys/dev/block", "/sys/devices/virtual/block", "/sys/fs/ext4",
    "/sys/class/bdi", "/sys/devices/virtual/bdi", "/proc/diskstats", "/proc/partitions",
]
"""Where the host's loop devices show their backing files, sizes and I/O counters."""
MASKED_PATHS = [*DOCKER_MASKED, *BLOCK_DEVICE_VIEWS]

SYSCALL_DENY = [
    # Asynchronous I/O contexts come from the host-wide fs.aio-max-nr; nothing in the image uses libaio.
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    # io_uring: its own attack surface and kernel-side workers; Bun, Python, git and ripgrep use epoll/threads.
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # Page-fault handling from user space widens races against the kernel; no tool in the image needs it.
    "userfaultfd",
    # Namespaces, mounts and chroot: the engine's default profile refuses them to a process without
    # CAP_SYS_ADMIN, so on runc this changes nothing. gVisor does not apply that profile (runsc's
    # --oci-seccomp breaks threads in its 2022 build: clone3 gets EPERM, not ENOSYS, and glibc does not fall
    # back), and there `unshare -r` made the tool user root of a new user namespace, with mount and chroot.
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", CLONE_NAMESPACES, "clone3",
]
"""Denied with EPERM in every sandbox process, on top of the engine's default profile (clone3: ENOSYS, and clone
only when it asks for new namespaces; sandbox_agent/syscall_filter.py). Measured first: bash, git, python3, bun
(custom tools, MCP servers), ripgrep and the language servers run the suite with it."""
SYSCALL_DENY_ENV = ENV_SYSCALL_DENY


def agent_env(tool_uid: int) -> dict[str, str]:
    """What tells the agent its tool uid and to install the filter (it refuses to serve when it cannot)."""
    return {ENV_TOOL_UID: str(tool_uid), SYSCALL_DENY_ENV: ",".join(SYSCALL_DENY)}


def create_container(client: Any, image: str, kwargs: dict[str, Any]) -> Any:
    """`client.containers.create(image, **kwargs)` with MaskedPaths added: docker-py's host config has no
    such option, so the request is built as docker-py builds it and the field is added (API 1.39+)."""
    from docker.models.containers import _create_container_args  # type: ignore[attr-defined]

    create_kwargs = _create_container_args({**kwargs, "image": image, "version": client.api._version})
    create_kwargs["host_config"]["MaskedPaths"] = list(MASKED_PATHS)
    created = client.api.create_container(**create_kwargs)
    container = client.containers.get(created["Id"])
    found = tenant_cgroups.parent_problems(container.attrs, kwargs.get("cgroup_parent"))
    if found:
        raise HardeningError("sandbox hardening could not be applied: " + "; ".join(found))
    return container


def verify(attrs: dict[str, Any], tool_uid: int, owns_uid: Callable[[int], bool]) -> None:
    """HardeningError unless the created container (`attrs`: its inspect data) has all of the above."""
    found = problems(attrs, tool_uid, owns_uid)
    if found:
        raise HardeningError("sandbox hardening could not be applied: " + "; ".join(found))


def verify_agent_filter(container: Any, runtime: str | None) -> None:
    """HardeningError unless the started agent runs under its filter, seen from the host. Under gVisor the
    sandbox's kernel is gVisor's own, whose processes the host does not see: there the agent's own check
    (it stops when io_setup still succeeds) is what holds. On both, the container's processes must be in the
    tenant's CPU group it was created under (tenant_cgroups.py)."""
    container.reload()
    problem = tenant_cgroups.process_problem(container.attrs)
    if problem is None and runtime != "runsc":
        problem = agent_filter_problem(int((container.attrs.get("State") or {}).get("Pid") or 0))
    if problem is not None:
        raise HardeningError(f"sandbox hardening could not be applied: {problem}")


def problems(attrs: dict[str, Any], tool_uid: int, owns_uid: Callable[[int], bool]) -> list[str]:
    """What of the above the engine did not apply to the created container (`attrs`: its inspect data)."""
    host = attrs.get("HostConfig") or {}
    found = []
    missing = [p for p in MASKED_PATHS if p not in (host.get("MaskedPaths") or [])]
    if missing:
        found.append(f"paths not masked: {', '.join(missing)}")
    env = dict(str(e).partition("=")[::2] for e in (attrs.get("Config") or {}).get("Env") or [])
    if env.get(SYSCALL_DENY_ENV) != agent_env(tool_uid)[SYSCALL_DENY_ENV]:
        found.append("the agent's syscall filter is not asked for")
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    if env.get(ENV_TOOL_UID) != str(tool_uid) or labels.get(LABEL_TOOL_UID) != str(tool_uid) \
            or not owns_uid(tool_uid):
        found.append(f"the tool uid is not the sandbox's own block ({env.get(ENV_TOOL_UID)})")
    accounts = {m.get("Destination"): m for m in attrs.get("Mounts") or []}
    if any(path not in accounts or accounts[path].get("RW") for path in ACCOUNT_FILES):
        found.append("the sandbox's own account files are not mounted read-only")
    if str((attrs.get("Config") or {}).get("User", "")) not in ("0:0", "0", "root"):
        found.append("the agent does not start as root (it could not switch to the tool uid)")
    return found


def agent_filter_problem(container_pid: int) -> str | None:
    """Whether the agent (the child of the container's init) runs under more than the engine's one seccomp
    filter; read from the host's /proc, so what runs in the sandbox cannot answer for it. None: it does."""
    with contextlib.suppress(OSError, ValueError):
        children = Path(f"/proc/{container_pid}/task/{container_pid}/children").read_text().split()
        for child in children:
            status = Path(f"/proc/{child}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields.get("Seccomp_filters", "0").strip()) >= 2:
                return None
        return "the agent did not install its syscall filter"
    return "the agent's syscall filter could not be checked (the control plane must run on the engine's host)"


TOOL_ACCOUNT = "tool"
"""The image's account for tool processes (Dockerfile.sandbox: uid and gid 1000)."""
ACCOUNT_FILES = ("/etc/passwd", "/etc/group")


def image_accounts(client: Any, image: str) -> dict[str, str]:
    """The image's /etc/passwd and /etc/group, read from a created (never started) container."""
    created = client.api.create_container(image, command=["true"], network_disabled=True)
    try:
        found = {}
        for path in ACCOUNT_FILES:
            stream, _ = client.api.get_archive(created["Id"], path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
                member = archive.extractfile(archive.getmembers()[0])
                found[path] = member.read().decode() if member is not None else ""
        return found
    finally:
        client.api.remove_container(created["Id"], force=True)


def sandbox_accounts(accounts: dict[str, str], tool_uid: int) -> dict[str, str]:
    """The image's account files with the `tool` user and group on the sandbox's own uid and gid: programs
    that look their user up (`id`, `whoami`, git's identity, `chfn`, `expiry`...) find it as before."""
    def moved(text: str, fields: tuple[int, ...]) -> str:
        lines = []
        for line in text.splitlines():
            parts = line.split(":")
            if parts[0] == TOOL_ACCOUNT and len(parts) > max(fields):
                for index in fields:
                    parts[index] = str(tool_uid)
            lines.append(":".join(parts))
        return "\n".join(lines) + "\n"

    return {"/etc/passwd": moved(accounts["/etc/passwd"], (2, 3)), "/etc/group": moved(accounts["/etc/group"], (2,))}


def account_mounts(sandbox_dir: Path, accounts: dict[str, str], tool_uid: int) -> list[Mount]:
    """Writes the sandbox's account files beside its socket (a root-only host dir) and mounts each, read-only,
    over the image's: the root filesystem stays read-only and shared by every sandbox."""
    mounts = []
    for path, text in sandbox_accounts(accounts, tool_uid).items():
        source = sandbox_dir / Path(path).name
        source.write_text(text)
        source.chmod(0o644)
        mounts.append(Mount(path, str(source), type="bind", read_only=True))
    return mounts
