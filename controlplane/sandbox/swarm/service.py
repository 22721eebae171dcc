"""A sandbox as a Swarm service: its task template (hardened as far as services allow) and the check that
the engine stored what was asked (fail closed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import docker
from docker.types import Mount

from controlplane.config import SwarmProviderConfig
from controlplane.core.sessions.models import Resources
from controlplane.errors import HardeningError
from controlplane.sandbox import code_mount, confinement
from controlplane.sandbox.layout import (
    AGENT_CAPS,
    AGENT_DIR,
    CAP_DROP,
    CODE_DIR,
    CODE_MODE,
    ENV_GRPC,
    ENV_TOOL_UID,
    LABEL_TOOL_UID,
    WORKSPACE,
    agent_env,
    limit_problems,
    privilege_problems,
)
from controlplane.sandbox.swarm import node_disks

NO_NEW_PRIVS = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) != 0:\n"  # PR_SET_NO_NEW_PRIVS
    "    sys.exit('cannot set no_new_privs: errno %d' % ctypes.get_errno())\n"
    "os.chmod(os.environ['AGENT_WORKSPACE'], 0o777)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)
"""Run before the agent: sets no_new_privs (inherited across fork and exec), then execs it. Swarm's
tmpfs cannot be owned by the tool user (runc gives it the image dir's mode, owner root), and the
agent has no CAP_CHOWN; as the owner it may still open the workspace to the tool user. A volume
would not do: Swarm leaves a task's volumes behind on its node."""
AGENT_COMMAND = ["env", "PYTHONSAFEPATH=1", "python3", "-c", NO_NEW_PRIVS, "python3", "-m", "sandbox_agent"]
"""With a safe sys.path for both Pythons, as the image's entrypoint (the working directory is the workspace)."""


def sandbox_template(
    config: SwarmProviderConfig, labels: dict[str, str], agent_dir: str, tmpfs_mb: int, resources: Resources,
    constraints: list[str], network_id: str, tool_uid: int, image: str = "", workspace: Mount | None = None,
) -> Any:
    """The one-replica task of a sandbox (of `image`, a template's, or the sandbox image): the agent under
    no_new_privs, tmpfs /tmp, /workspace and code dir, its socket dir bound from the node, limits and
    reservations, only its own internal network; its tools run as its own uid block (`tool_uid`, also in
    `labels`) under the agent's syscall filter. `workspace`: a kept disk's volume instead of the tmpfs (node_disks)."""
    memory = resources.memory_mb * 1024 * 1024
    spec = docker.types.ContainerSpec(
        image or config.image, command=AGENT_COMMAND, hostname="sandbox", user="0:0", labels=labels,
        env={**agent_env(), **confinement.agent_env(tool_uid), ENV_GRPC: "1"},
        mounts=[
            Mount("/tmp", None, type="tmpfs", tmpfs_size=tmpfs_mb * 1024 * 1024, tmpfs_mode=0o1777),
            workspace or Mount(WORKSPACE, None, type="tmpfs", tmpfs_size=config.workspace_mb * 1024 * 1024),
            Mount(CODE_DIR, None, type="tmpfs", tmpfs_size=code_mount.code_mb(resources.memory_mb) << 20,
                  tmpfs_mode=CODE_MODE),
            Mount(AGENT_DIR, agent_dir, type="bind"),
        ],
        read_only=True, init=True, cap_drop=list(CAP_DROP), cap_add=list(AGENT_CAPS), stop_grace_period=2_000_000_000,
    )
    task_resources = docker.types.Resources(
        cpu_limit=int(resources.cpu * 1e9), mem_limit=memory,
        cpu_reservation=int(resources.cpu * 1e9 * config.reserve_fraction),
        mem_reservation=int(memory * config.reserve_fraction),
    )
    task_resources["Limits"]["Pids"] = resources.pids
    preferences = [("spread", config.spread)] if config.spread else None
    return docker.types.TaskTemplate(
        spec, resources=task_resources, restart_policy=docker.types.RestartPolicy(condition="none"),
        placement=docker.types.Placement(constraints=constraints, preferences=preferences),
        networks=[network_id],
    )


def verify_service_hardening(
    service: dict[str, Any], resources: Resources, network_id: str, tool_uid: int, owns_uid: Callable[[int], bool],
) -> None:
    """Fails closed when the engine stored a weaker service than asked (old engines drop fields)."""
    template = service["Spec"]["TaskTemplate"]
    container = template["ContainerSpec"]
    limits = (template.get("Resources") or {}).get("Limits") or {}
    problems = privilege_problems(container.get("CapabilityDrop"), container.get("CapabilityAdd"))
    if container.get("ReadOnly") is not True:
        problems.append("root filesystem is writable")
    if container.get("Command") != AGENT_COMMAND:
        problems.append("the agent would start without no_new_privs")
    if container.get("Privileges"):
        problems.append(f"privileges set: {container.get('Privileges')}")
    problems += limit_problems(limits.get("Pids"), limits.get("MemoryBytes"), limits.get("NanoCPUs"), resources)
    if (template.get("RestartPolicy") or {}).get("Condition") != "none":
        problems.append("restart policy is not none")
    networks = [n.get("Target") for n in template.get("Networks") or []]
    if networks != [network_id]:
        problems.append(f"attached to {networks}, wanted only the session's internal network")
    if any("docker.sock" in str(m.get("Source", "")) for m in container.get("Mounts") or []):
        problems.append("the Docker socket is mounted")
    problems += code_mount.service_problems(container.get("Mounts") or [])
    problems += node_disks.mount_problems(container.get("Mounts") or [])
    problems += confinement_problems(service, tool_uid, owns_uid)
    if problems:
        raise HardeningError("sandbox hardening could not be applied: " + "; ".join(problems))


def confinement_problems(service: dict[str, Any], tool_uid: int, owns_uid: Callable[[int], bool]) -> list[str]:
    """What is wrong with the stored service's tool uid block and syscall filter ([] when both are its own).
    The agent stops when its filter does not hold (a denied call succeeds), so asking for it is what the
    control plane can check here: unlike the Docker provider's, a task's /proc is on another node."""
    container = service["Spec"]["TaskTemplate"]["ContainerSpec"]
    env = dict(str(e).partition("=")[::2] for e in container.get("Env") or [])
    wanted = confinement.agent_env(tool_uid)
    found = []
    if env.get(confinement.SYSCALL_DENY_ENV) != wanted[confinement.SYSCALL_DENY_ENV]:
        found.append("the agent's syscall filter is not asked for")
    labels = [(service["Spec"].get("Labels") or {}), (container.get("Labels") or {})]
    if env.get(ENV_TOOL_UID) != str(tool_uid) or any(lab.get(LABEL_TOOL_UID) != str(tool_uid) for lab in labels) \
            or not owns_uid(tool_uid):
        found.append(f"the tool uid is not the sandbox's own block ({env.get(ENV_TOOL_UID)})")
    return found
