"""One hardened Docker container per session, a warm pool of them, and label-based reconciliation.

Every container, volume and socket dir carries the labels of sandbox/layout.py, which say how a pooled
container's session is recorded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount

from controlplane.config import DockerProviderConfig, PoolConfig, ResourcesConfig
from controlplane.config_lifecycle import TemplateConfig
from controlplane.core.calls.tracked_tasks import TrackedTasks
from controlplane.core.seam.provider import (
    PoolStats,
    ReconcileReport,
    Sandbox,
    SandboxLedger,
    SandboxProvider,
    SandboxRecord,
    SandboxState,
)
from controlplane.core.sessions.fair_gate import FairGate
from controlplane.core.sessions.models import Resources
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE, TemplateInfo
from controlplane.errors import ConfigError, HardeningError, SandboxError, SandboxLostError, SandboxStartError
from controlplane.sandbox import cgroup_cpu, code_mount, confinement, container_removal, gvisor_limits, tenant_cgroups
from controlplane.sandbox import workspace_salvage as salvage
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.engine_calls import after, in_thread
from controlplane.sandbox.layout import (
    AGENT_CAPS,
    AGENT_DIR,
    CAP_DROP,
    EGRESS_PORT,
    ENV_OUTPUT_BUDGET,
    GLOBAL_DIR,
    LABEL_IMAGE,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_SANDBOX,
    LABEL_SESSION,
    LABEL_TEMPLATE,
    LABEL_TENANT,
    LABEL_TOOL_UID,
    SECURITY_OPTS,
    SOCKET_NAME,
    WORKSPACE,
    SandboxDirs,
    agent_env,
    engine_name,
    global_source,
    limit_problems,
    privilege_problems,
    wanted_global_source,
)
from controlplane.sandbox.runtime_pools import RuntimePools, pool_maker
from controlplane.sandbox.templates import TemplateImages
from controlplane.sandbox.tool_ids import ToolIds, engine_uids
from controlplane.sandbox.volume_owners import instance_volumes, volume_owner
from controlplane.sandbox.workspace_disk import WorkspaceDisks, create_volume

log = logging.getLogger(__name__)


class DockerSandboxProvider(SandboxProvider):
    def __init__(
        self,
        config: DockerProviderConfig,
        pool: PoolConfig,
        resources: ResourcesConfig,
        data_dir: Path,
        instance: str,
        ledger: SandboxLedger,
        runtimes: Mapping[str, str] | None = None,
        templates: Iterable[TemplateConfig] = (),
    ) -> None:
        self._config = config
        self._defaults = Resources(resources.cpu, resources.memory_mb, resources.pids)
        self._tmpfs_mb = resources.tmpfs_mb
        self._shm_mb = resources.shm_mb
        self._output_budget_mb = resources.output_budget_mb
        self._disks = WorkspaceDisks(data_dir, resources.disk_mb) if resources.disk_mb else None
        self._instance = instance
        self._ledger = ledger
        self._dirs = SandboxDirs(data_dir, own_filesystem=True)
        self._tool_ids = ToolIds(config.tool_uid_first, config.tool_uid_count)
        self._client = docker.DockerClient(base_url=config.base_url) if config.base_url else docker.from_env()
        self._live: dict[str, Sandbox] = {}
        self._cleanups = TrackedTasks()
        """Removals whose callers went away: awaited before the engine client closes."""
        self._attached: dict[str, Sandbox] = {}
        """Other control planes' sandboxes this one has reached (see `attach`)."""
        self._attached_sockets: dict[str, str] = {}
        """Their agent sockets (host paths, not shown to clients): gone once the owner removed the sandbox."""
        self._retained: set[str] = set()
        """Sandboxes of failed sessions whose workspaces stay until the session is deleted (`retire`, `retain`)."""
        self._creates = FairGate.for_creates()
        """Session creates that start a container (pool misses), tenants in turn (core/sessions/fair_gate.py)."""
        self._cgroups = tenant_cgroups.TenantCgroups(instance, config.tenant_cpu_weight)
        self._templates = TemplateImages(config.base_url, config.image, templates, instance, pool.size)
        self._pools = RuntimePools(config.runtime, runtimes or {}, pool_maker(
            pool.refill_concurrency, self._create_pooled, self.destroy, self._healthy), self._templates.pool_sizes())

    # -- naming --

    def _name(self, sandbox_id: str) -> str:
        return engine_name(self._instance, sandbox_id)

    def _volume(self, sandbox_id: str) -> str:
        return engine_name(self._instance, f"{sandbox_id}-ws")

    def _labels(self, sandbox_id: str, session_id: str = "", template: str = DEFAULT_TEMPLATE) -> dict[str, str]:
        labels = {
            LABEL_MANAGED: "true",
            LABEL_INSTANCE: self._instance,
            LABEL_SANDBOX: sandbox_id,
            LABEL_IMAGE: self._templates.image(template),
            LABEL_TEMPLATE: template,
        }
        if session_id:
            labels[LABEL_SESSION] = session_id
        return labels

    # -- lifecycle --

    async def start(self, live: Mapping[str, str]) -> ReconcileReport:
        global_dir = self._config.global_dir
        if global_dir is not None and not global_dir.is_dir():
            raise ConfigError(f"provider.global_dir {global_dir} is not a directory on this host")
        try:
            self._accounts = await asyncio.to_thread(confinement.image_accounts, self._client, self._config.image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxStartError(
                f"sandbox image {self._config.image} is not on the engine; build it with `make image`"
            ) from exc
        except docker.errors.DockerException as exc:
            raise SandboxStartError(f"the Docker engine does not answer: {exc}") from exc
        await asyncio.to_thread(self._cgroups.start, self._client)
        await self._templates.start(self._pools.start)  # tags first: pooled sandboxes are adopted by tag
        report = await self._reconcile(live)
        self._pools.start(DEFAULT_TEMPLATE, *self._templates.ready())
        self._templates.start_pruning()
        return report

    async def close(self) -> None:
        await self._templates.close()
        await self._pools.close()
        await self._cleanups.wait()
        for sandbox in [*self._live.values(), *self._attached.values()]:
            await sandbox.agent.close()
        self._live.clear()
        self._attached.clear()
        self._attached_sockets.clear()
        await asyncio.to_thread(self._client.close)

    network_port = EGRESS_PORT

    def network_socket(self, sandbox_id: str) -> str:
        return str(self._dirs.egress_socket_path(sandbox_id))

    def pool_stats(self) -> PoolStats:
        return self._pools.stats()

    def templates(self) -> list[TemplateInfo]:
        return self._templates.infos()

    async def acquire(self, session_id: str, tenant: str, resources: Resources,
                      template: str = DEFAULT_TEMPLATE) -> Sandbox:
        await self._templates.wait(template)
        if resources == self._defaults:
            sandbox = await self._pools.pool_for(tenant, template).take(tenant)
            if sandbox is not None:
                try:
                    await self._ledger.claim_sandbox(sandbox.id, session_id)
                    await asyncio.to_thread(self._cgroups.claim, sandbox, tenant)
                    labels = self._labels(sandbox.id, session_id, template) | {LABEL_TENANT: tenant}
                    await asyncio.to_thread(self._dirs.write_labels, sandbox.id, labels)
                except BaseException:  # out of the pool, in no session: nothing else would remove it
                    await self._cleanups.run(self.destroy(sandbox.id))
                    raise
                sandbox.from_pool = True
                return sandbox
        async with self._creates.slot(tenant):
            return await self._create(session_id, resources, tenant, self._pools.runtime_for(tenant), template)

    async def get(self, sandbox_id: str) -> Sandbox:
        sandbox = self._live.get(sandbox_id)
        if sandbox is None:
            raise SandboxLostError(f"sandbox {sandbox_id} does not exist (any more)")
        return sandbox

    async def attach(self, sandbox_id: str) -> Sandbox:
        """Another control plane's container on this engine: its agent socket is found through the
        container's own bind mount, so the two planes need not share a data dir."""
        known = self._live.get(sandbox_id)
        if known is not None:
            return known
        attached = self._attached.get(sandbox_id)
        if attached is not None and self._socket_left(sandbox_id):
            return attached
        # A new attachment: first drop those whose owners removed their sandboxes (the socket went with the
        # agent dir), so that channels do not pile up over the process's life.
        for gone_id in [i for i in self._attached if not self._socket_left(i)]:
            await self._attached.pop(gone_id).agent.close()
            self._attached_sockets.pop(gone_id, None)
        containers = await asyncio.to_thread(
            self._client.containers.list, filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_SANDBOX}={sandbox_id}"]}
        )
        if not containers:
            raise SandboxLostError(f"sandbox {sandbox_id} has no running container on this engine")
        container = containers[0]
        mounts = container.attrs.get("Mounts") or []
        sources = [m.get("Source", "") for m in mounts if m.get("Destination") == AGENT_DIR]
        if not sources:
            raise SandboxLostError(f"sandbox {sandbox_id}: its container has no agent directory")
        socket = str(Path(sources[0]) / SOCKET_NAME)
        agent = GrpcSandboxAgent(f"unix:{socket}", sandbox_id)
        sandbox = Sandbox(sandbox_id, agent, details={"container_id": container.id or ""})
        self._attached[sandbox_id] = sandbox
        self._attached_sockets[sandbox_id] = socket
        return sandbox

    def _socket_left(self, sandbox_id: str) -> bool:
        return os.path.exists(self._attached_sockets.get(sandbox_id, ""))

    async def cpu_seconds(self, sandbox_id: str) -> float | None:
        sandbox = self._live.get(sandbox_id)
        if sandbox is None:
            return None
        return await asyncio.to_thread(cgroup_cpu.cpu_seconds, str(sandbox.details.get("container_id", "")))

    async def destroy(self, sandbox_id: str) -> None:
        sandbox = self._live.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.agent.close()
        await container_removal.remove_sandbox(self._client.api, self._name(sandbox_id), self._volume(sandbox_id))
        await asyncio.to_thread(self._cgroups.release, sandbox_id)
        await asyncio.to_thread(self._release_storage, sandbox_id)
        await self._ledger.forget_sandbox(sandbox_id)
        self._retained.discard(sandbox_id)

    async def keeps_workspace(self, sandbox_id: str) -> bool:
        return True  # a volume

    async def retire(self, sandbox_id: str) -> None:
        """The container and socket dir go; the workspace volume (and its disk image) stay until `destroy`."""
        sandbox = self._live.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.agent.close()
        self._retained.add(sandbox_id)
        await container_removal.remove_container(self._client.api, self._name(sandbox_id))
        await asyncio.to_thread(self._cgroups.release, sandbox_id)
        await asyncio.to_thread(self._dirs.remove, sandbox_id)
        await self._ledger.forget_sandbox(sandbox_id)

    def salvage(self, sandbox_id: str) -> salvage.Chunks:
        return salvage.read(self._client, self._dirs.root, self._volume(sandbox_id), self._labels(sandbox_id),
                            self._cleanups)

    def retain(self, sandbox_ids: Iterable[str]) -> None:
        self._retained.update(sandbox_ids)

    def _release_storage(self, sandbox_id: str) -> None:
        if self._disks is not None:
            self._disks.release(sandbox_id)
        self._dirs.remove(sandbox_id)

    # -- creation --

    async def _create_pooled(self, runtime: str | None = None, template: str = DEFAULT_TEMPLATE) -> Sandbox:
        return await self._create("", self._defaults, "", runtime, template)

    async def _create(self, session_id: str, resources: Resources, tenant: str, runtime: str | None,
                      template: str = DEFAULT_TEMPLATE) -> Sandbox:
        sandbox_id = secrets.token_hex(6)
        state: SandboxState = "claimed" if session_id else "pool"
        await self._ledger.put_sandbox(SandboxRecord(sandbox_id, self._instance, "creating", session_id, time.time()))
        creating = in_thread(self._create_container, sandbox_id, session_id, resources, tenant, runtime, template)
        try:
            container = await asyncio.shield(creating)
            agent = GrpcSandboxAgent(f"unix:{self._dirs.socket_path(sandbox_id)}", sandbox_id)
            sandbox = Sandbox(sandbox_id, agent, details={"container_id": container.id or ""})
            self._live[sandbox_id] = sandbox
            await self._wait_ready(sandbox, container)
            await asyncio.to_thread(confinement.verify_agent_filter, container, runtime)
            await self._ledger.put_sandbox(SandboxRecord(sandbox_id, self._instance, state, session_id, time.time()))
        except BaseException:
            await self._cleanups.run(after(creating, self.destroy(sandbox_id)))
            raise
        return sandbox

    def _create_container(self, sandbox_id: str, session_id: str, resources: Resources, tenant: str,
                          runtime: str | None, template: str) -> Container:
        with self._tool_ids.claimed(lambda: engine_uids(self._client), sandbox_id) as tool_uid:
            return self._create_as(sandbox_id, session_id, resources, tenant, tool_uid, runtime, template)

    def _create_as(self, sandbox_id: str, session_id: str, resources: Resources, tenant: str,
                        tool_uid: int, runtime: str | None, template: str) -> Container:
        labels = self._labels(sandbox_id, session_id, template)
        self._dirs.create(sandbox_id, labels | ({LABEL_TENANT: tenant} if tenant else {}))
        labels[LABEL_TOOL_UID] = str(tool_uid)
        create_volume(self._client, self._volume(sandbox_id), self._disks, sandbox_id, tool_uid, labels)
        kwargs: dict[str, Any] = {
            "name": self._name(sandbox_id),
            "labels": labels,
            "hostname": "sandbox",
            "user": "0:0",
            "init": True,
            "network_mode": "none",
            "cap_drop": list(CAP_DROP),
            "cap_add": list(AGENT_CAPS),
            "security_opt": list(SECURITY_OPTS),
            "read_only": True,
            "privileged": False,
            # tmpfs pages count against the memory limit and cannot be reclaimed: a full /tmp in a small
            # session would leave the OOM killer only the agent. So each takes at most a share of the memory.
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={min(self._tmpfs_mb, resources.memory_mb // 4)}m,mode=1777",
                      "/dev/shm": f"rw,noexec,nosuid,nodev,size={min(self._shm_mb, resources.memory_mb // 8)}m,"
                                  "mode=1777",
                      **code_mount.docker_tmpfs(resources.memory_mb)},
            "mounts": [
                Mount(WORKSPACE, self._volume(sandbox_id), type="volume", no_copy=True),
                Mount(AGENT_DIR, str(self._dirs.path(sandbox_id)), type="bind"),
                *confinement.account_mounts(self._dirs.path(sandbox_id), self._accounts, tool_uid),
                *self._global_mount(),
            ],
            **gvisor_limits.container_limits(resources.pids, runtime),
            "mem_limit": resources.memory_mb * 1024 * 1024,
            "memswap_limit": resources.memory_mb * 1024 * 1024,
            "nano_cpus": int(resources.cpu * 1e9),
            "environment": agent_env() | {ENV_OUTPUT_BUDGET: str(self._output_budget_mb << 20)}
                           | confinement.agent_env(tool_uid),
            "detach": True,
            **self._cgroups.join(sandbox_id, tenant),
        }
        if runtime:
            kwargs["runtime"] = runtime
        try:
            container: Container = confinement.create_container(self._client, labels[LABEL_IMAGE], kwargs)
        except docker.errors.APIError as exc:
            raise HardeningError(f"the engine refused the hardened container: {exc.explanation or exc}") from exc
        verify_hardening(container.attrs, resources, runtime)
        confinement.verify(container.attrs, tool_uid, self._tool_ids.owns)
        container.start()
        return container

    def _global_mount(self) -> list[Mount]:
        if self._config.global_dir is None:
            return []
        return [Mount(GLOBAL_DIR, str(self._config.global_dir.resolve()), type="bind", read_only=True)]

    async def _wait_ready(self, sandbox: Sandbox, container: Container) -> None:
        deadline = time.monotonic() + self._config.start_timeout_s
        next_check = time.monotonic() + 0.25
        while not self._dirs.listening(sandbox.id):
            if time.monotonic() > deadline:
                raise SandboxStartError(
                    f"sandbox {sandbox.id}: agent did not start within {self._config.start_timeout_s} s"
                )
            if time.monotonic() > next_check:
                next_check = time.monotonic() + 0.25
                await asyncio.to_thread(container.reload)
                if container.status not in ("created", "running"):
                    logs = await asyncio.to_thread(container.logs, tail=20)
                    raise SandboxStartError(
                        f"sandbox {sandbox.id} exited while starting ({container.status}): "
                        f"{logs.decode(errors='replace').strip()}"
                    )
            await asyncio.sleep(0.005)
        await sandbox.agent.health(timeout_s=max(1.0, deadline - time.monotonic()))

    async def _healthy(self, sandbox: Sandbox) -> bool:
        try:
            await sandbox.agent.health(timeout_s=1.0)
        except SandboxError:
            return False
        return True

    # -- reconciliation --

    async def _reconcile(self, live: Mapping[str, str]) -> ReconcileReport:
        report = ReconcileReport()
        records = {r.id: r for r in await self._ledger.list_sandboxes(self._instance)}
        containers = await asyncio.to_thread(
            self._client.containers.list, all=True, filters={"label": f"{LABEL_INSTANCE}={self._instance}"}
        )
        kept: set[str] = set()
        for container in containers:
            sandbox_id = container.labels.get(LABEL_SANDBOX, "")
            record = records.get(sandbox_id)
            keep = await self._adopt(container, record, live, report) if record else False
            if keep:
                kept.add(sandbox_id)
            elif record and record.state == "claimed" and live.get(sandbox_id) == record.session_id:
                await self.retire(sandbox_id)  # its session fails below (lost), its workspace stays
                report.removed.append(sandbox_id)
            else:
                await self.destroy(sandbox_id) if sandbox_id else await asyncio.to_thread(container.remove, force=True)
                report.removed.append(sandbox_id or container.name or "")
        for sandbox_id, record in records.items():
            if sandbox_id not in kept:
                if record.state == "claimed" and sandbox_id in live:
                    report.lost.append(sandbox_id)
                    await self.retire(sandbox_id)
                else:
                    await self.destroy(sandbox_id)
        # A failed session's workspace is the user's work: it stays until the session is deleted.
        kept_workspaces = kept | self._retained
        for volume in await asyncio.to_thread(instance_volumes, self._client, self._instance):
            if volume_owner(volume, self._instance) not in kept_workspaces:
                await asyncio.to_thread(volume.remove, force=True)
                report.removed.append(volume.name or "")
        disks = self._disks
        for sandbox_id in await asyncio.to_thread(disks.list_ids) if disks is not None else []:
            if sandbox_id not in kept_workspaces and disks is not None:
                await asyncio.to_thread(disks.release, sandbox_id)
                report.removed.append(f"{sandbox_id}.img")
        for sandbox_id in await asyncio.to_thread(self._dirs.list_ids):
            if sandbox_id not in kept:
                await asyncio.to_thread(self._dirs.remove, sandbox_id)
                report.removed.append(sandbox_id)
        return report

    async def _adopt(
        self, container: Container, record: SandboxRecord, live: Mapping[str, str], report: ReconcileReport
    ) -> bool:
        sandbox_id = record.id
        if record.state == "claimed" and live.get(sandbox_id) != record.session_id:
            return False
        template = container.labels.get(LABEL_TEMPLATE, DEFAULT_TEMPLATE)
        if record.state == "pool" and container.labels.get(LABEL_IMAGE) != self._templates.ready_image(template):
            return False  # not its template's image now (the template was rebuilt, or is not configured any more)
        if record.state == "pool" and global_source(container.attrs) != wanted_global_source(self._config.global_dir):
            return False  # pooled under another global tools dir: its sessions would see the wrong tools
        if record.state == "creating":
            return False
        if container.status != "running":
            if record.state != "claimed":
                return False
            try:  # the engine restarted: the workspace volume survived, so bring the session back
                await asyncio.to_thread(container.start)
            except docker.errors.APIError:
                return False
        agent = GrpcSandboxAgent(f"unix:{self._dirs.socket_path(sandbox_id)}", sandbox_id)
        sandbox = Sandbox(sandbox_id, agent, details={"container_id": container.id or ""})
        self._live[sandbox_id] = sandbox
        try:
            await sandbox.agent.health(timeout_s=10.0)
        except SandboxError:
            self._live.pop(sandbox_id, None)
            await agent.close()
            return False
        if record.state == "pool":
            if not self._pools.adopt(sandbox, container.attrs, template):
                return False
            report.pooled.append(sandbox_id)
        else:
            report.adopted.append(sandbox_id)
        return True


def verify_hardening(attrs: dict[str, Any], resources: Resources, runtime: str | None) -> None:
    """Fails closed when the engine did not apply a required option (it may drop some silently)."""
    host = attrs.get("HostConfig") or {}
    problems = []
    if host.get("NetworkMode") != "none":
        problems.append(f"network is {host.get('NetworkMode')!r}, not none")
    problems += privilege_problems(host.get("CapDrop"), host.get("CapAdd"))
    for wanted in SECURITY_OPTS:
        if not any(str(o).startswith(wanted) for o in host.get("SecurityOpt") or []):
            problems.append(f"{wanted} is not set")
    if host.get("ReadonlyRootfs") is not True:
        problems.append("root filesystem is writable")
    if host.get("Privileged"):
        problems.append("container is privileged")
    problems += limit_problems(resources.pids, host.get("Memory"), host.get("NanoCpus"), resources)
    problems += gvisor_limits.problems(host, resources.pids, runtime)
    if runtime and host.get("Runtime") != runtime:
        problems.append(f"runtime is {host.get('Runtime')}, wanted {runtime}")
    mounts = [str(m.get("Source", "")) for m in attrs.get("Mounts") or []] + list(host.get("Binds") or [])
    if any("docker.sock" in m for m in mounts):
        problems.append("the Docker socket is mounted")
    if any(m.get("Destination") == GLOBAL_DIR and m.get("RW") for m in attrs.get("Mounts") or []):
        problems.append("the global tools dir is mounted writable")
    problems += code_mount.container_problems(host)
    if problems:
        raise HardeningError("sandbox hardening could not be applied: " + "; ".join(problems))

