"""What a sandbox looks like from outside, whichever provider runs it: the labels on its engine objects, the
privileges it keeps, the paths and environment its agent gets, and its private dir on the host.

Kept in one module because several readers must agree on every value: reconciliation finds sandboxes by
these labels, the fail-closed hardening checks compare what the engine stored against these same lists,
and the agent in the image expects these paths. A provider that spelled one of them itself could drift.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from controlplane.core.sessions.models import Resources
from controlplane.errors import ConfigError
from controlplane.sandbox import dir_mounts

# -- labels: on containers, services, networks, volumes and each sandbox dir's labels.json ------------

LABEL_MANAGED = "ocsb.managed"
LABEL_INSTANCE = "ocsb.instance"
"""The control plane that owns the object: reconciliation only ever touches its own instance's."""
LABEL_SANDBOX = "ocsb.sandbox"
LABEL_SESSION = "ocsb.session"
"""Only on objects made for a known session: Docker labels cannot change after creation, so a pooled
sandbox's session is in the store and in its dir's labels.json instead."""
LABEL_TENANT = "ocsb.tenant"
LABEL_IMAGE = "ocsb.image"
LABEL_TEMPLATE = "ocsb.template"
"""The template a sandbox (and a template image) was made for; a pooled sandbox goes back to that template's pool."""
LABEL_TOOL_UID = "ocsb.tool_uid"
"""The first uid of the sandbox's own block (tool_ids): read back when a restarted plane adopts it."""
"""A pooled sandbox of another image is not adopted after a restart."""
LABEL_ROLE = "ocsb.role"
"""Swarm: `sandbox` or `relay`, since both kinds of service carry the instance label."""
LABEL_RELAY_HASH = "ocsb.relay-hash"
"""Swarm: the relay service's inputs, so that a relay whose inputs changed is replaced."""


def engine_name(instance: str, what: str) -> str:
    """The engine object's name (container, volume, service, network): `ocsb-<instance>-<what>`, so that one
    instance's names never collide with another's on a shared engine, and its volumes are found by prefix."""
    return f"ocsb-{instance}-{what}"


# -- privileges --------------------------------------------------------------------------------------

CAP_DROP = ("ALL",)
AGENT_CAPS = ("SETUID", "SETGID", "KILL")
"""All the agent keeps: switching to the tool uid and stopping tool process groups."""
SECURITY_OPTS = ("no-new-privileges",)
"""Containers only: services have no such option, so the Swarm provider starts the agent under no_new_privs."""
TOOL_OWNER = "1000:1000"
"""The image's tool user (uid:gid), which owns an empty workspace filesystem's root."""


def privilege_problems(dropped: object, added: list[str] | None) -> list[str]:
    """What is wrong with the capabilities the engine stored for a sandbox ([] when it keeps only the agent's)."""
    problems = []
    if dropped != list(CAP_DROP):
        problems.append(f"capabilities not all dropped ({dropped})")
    if not set(added or []) <= {*AGENT_CAPS, *(f"CAP_{c}" for c in AGENT_CAPS)}:
        problems.append(f"unexpected capabilities {added}")
    return problems


def limit_problems(pids: object, memory_bytes: object, nano_cpus: object, resources: Resources) -> list[str]:
    """What is wrong with the limits the engine stored for a sandbox ([] when they are the session's)."""
    problems = []
    if pids != resources.pids:
        problems.append(f"pids limit is {pids}, wanted {resources.pids}")
    if memory_bytes != resources.memory_mb * 1024 * 1024:
        problems.append(f"memory limit is {memory_bytes}, wanted {resources.memory_mb} MiB")
    if nano_cpus != int(resources.cpu * 1e9):
        problems.append(f"cpu limit is {nano_cpus}, wanted {resources.cpu}")
    return problems

# -- paths in the sandbox and the agent's environment ------------------------------------------------

WORKSPACE = "/workspace"
AGENT_DIR = "/run/agent"
"""Bound from the sandbox's host dir: the agent's socket is the control plane's only way in."""
SOCKET_NAME = "agent.sock"
FRAMES_SOCKET_NAME = "frames.sock"
"""The agent's framed socket beside it (sandbox_agent/frames.py): made first, and the only one where the agent serves
no gRPC (the Docker provider's)."""
EGRESS_SOCKET_NAME = "egress.sock"
"""The session proxy's socket, beside the agent's: the agent's forwarder relays the tools' connections to it
(sandbox_agent/egress_forwarder.py names it too). The dir is 0700 root: a tool process cannot reach it directly."""
EGRESS_PORT = 3128
"""The forwarder's port on the sandbox's own loopback (the proxy variables point at it)."""
GLOBAL_DIR = "/opt/opencode/global"
"""Where the agent looks for the operator's global tools dir (upstream's `~/.config/opencode`)."""
CODE_DIR = "/run/code"
"""The session's code snapshot, a tmpfs of its own (see code_mount for why)."""
CODE_MODE = 0o755
"""Root-owned and not world-writable: a tmpfs defaults to 1777, which would let tools plant code there."""
WORKSPACE_MOUNT_OPTIONS = "nodev,nosuid,noatime"
"""A size-limited workspace's filesystem (workspace_disk)."""
RELAY_DIR = "/run/ocsb"
"""Swarm: where each node's relay sees the node's sandbox dirs (in the relay's container, not a sandbox)."""

ENV_SOCKET = "AGENT_SOCKET"
ENV_WORKSPACE = "AGENT_WORKSPACE"
ENV_CODE_DIR = "AGENT_CODE_DIR"
"""The agent refuses to snapshot there unless no tool process can write it."""
ENV_OUTPUT_BUDGET = "AGENT_OUTPUT_BUDGET_BYTES"
ENV_TOOL_UID = "AGENT_TOOL_UID"
ENV_SYSCALL_DENY = "AGENT_SYSCALL_DENY"
ENV_GRPC = "AGENT_GRPC"
"""Set to 1 where the plane reaches the agent over gRPC (Swarm's relay); elsewhere the agent serves frames only."""


def agent_env() -> dict[str, str]:
    """The environment every provider gives the agent (a provider may add its own)."""
    return {ENV_SOCKET: f"{AGENT_DIR}/{SOCKET_NAME}", ENV_WORKSPACE: WORKSPACE, ENV_CODE_DIR: CODE_DIR}


# -- the sandbox's dir on the host -------------------------------------------------------------------

LABELS_FILE = "labels.json"
_MAX_UNIX_PATH = 107


class SandboxDirs:
    """`DATA_DIR/sandboxes/<id>/`: private (0700) host dirs, one per sandbox. With `own_filesystem` each is a
    tmpfs of its own (dir_mounts: what a container binds from it then names no host path)."""

    def __init__(self, data_dir: Path, own_filesystem: bool = False) -> None:
        self.root = data_dir / "sandboxes"
        self._own_filesystem = own_filesystem
        probe = self.socket_path("x" * 12)
        if len(str(probe)) > _MAX_UNIX_PATH:
            raise ConfigError(f"data_dir {data_dir} is too long for a Unix socket path; choose a shorter one")

    def path(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id

    def socket_path(self, sandbox_id: str) -> Path:
        return self.path(sandbox_id) / SOCKET_NAME

    def listening(self, sandbox_id: str) -> bool:
        """The sandbox's agent has made a socket: its framed one or its gRPC one (it may serve only one of them)."""
        return any((self.path(sandbox_id) / name).exists() for name in (FRAMES_SOCKET_NAME, SOCKET_NAME))

    def egress_socket_path(self, sandbox_id: str) -> Path:
        return self.path(sandbox_id) / EGRESS_SOCKET_NAME

    def create(self, sandbox_id: str, labels: dict[str, str]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path(sandbox_id)
        path.mkdir(mode=0o700, exist_ok=True)
        if self._own_filesystem and not os.path.ismount(path):
            dir_mounts.mount_private(path)
        self.write_labels(sandbox_id, labels)
        return path

    def write_labels(self, sandbox_id: str, labels: dict[str, str]) -> None:
        target = self.path(sandbox_id) / LABELS_FILE
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(labels, sort_keys=True))
        os.replace(tmp, target)

    def read_labels(self, sandbox_id: str) -> dict[str, str]:
        try:
            data = json.loads((self.path(sandbox_id) / LABELS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def remove(self, sandbox_id: str) -> None:
        if self._own_filesystem:
            dir_mounts.unmount(self.path(sandbox_id))
        shutil.rmtree(self.path(sandbox_id), ignore_errors=True)

    def list_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [p.name for p in self.root.iterdir() if p.is_dir()]


def global_source(attrs: dict[str, Any]) -> str | None:
    """The host dir a container has at GLOBAL_DIR, if any."""
    for mount in attrs.get("Mounts") or []:
        if mount.get("Destination") == GLOBAL_DIR:
            return str(mount.get("Source", ""))
    return None


def wanted_global_source(global_dir: Path | None) -> str | None:
    """The host dir `global_dir` names, as a container's mount reports it (None: no global tools dir)."""
    return None if global_dir is None else str(global_dir.resolve())
