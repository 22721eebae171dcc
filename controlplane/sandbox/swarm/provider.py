"""The Swarm provider: places, watches, adopts and removes sandboxes, and reports the ones it loses.

Per session: a service `ocsb-<instance>-<id>` (restart none, limits and reservations, all caps
dropped but the agent's three, read-only root, tmpfs /tmp and /workspace) attached only to its own
`--internal` overlay network of the same name, so it has no route out and nothing to talk to.
Tools run as the sandbox's own uid block (tool_blocks), under no_new_privs and the agent's syscall
filter (service). The agent's channel: channel (control plane) -> mutual TLS ->
relay (a global service, one per node) -> the agent's Unix socket on that node. The task template and
its fail-closed check are in service, the relay service and its per-node clients in fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from controlplane.config import PoolConfig, ResourcesConfig, SwarmProviderConfig
from controlplane.config_lifecycle import TemplateConfig
from controlplane.core.calls.tracked_tasks import TrackedTasks
from controlplane.core.seam.provider import (
    LostListener,
    LostSandbox,
    PoolStats,
    ReconcileReport,
    Sandbox,
    SandboxLedger,
    SandboxProvider,
    SandboxRecord,
    SandboxState,
)
from controlplane.core.sessions.models import Resources
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE, TemplateInfo
from controlplane.errors import HardeningError, SandboxError, SandboxLostError, SandboxStartError
from controlplane.sandbox.agent_client import GrpcSandboxAgent
from controlplane.sandbox.engine_calls import after, in_thread
from controlplane.sandbox.layout import (
    AGENT_DIR,
    LABEL_IMAGE,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_SANDBOX,
    LABEL_SESSION,
    LABEL_TEMPLATE,
    LABEL_TENANT,
    LABEL_TOOL_UID,
    engine_name,
)
from controlplane.sandbox.runtime_pools import RuntimePools, pool_maker
from controlplane.sandbox.swarm.adoption import reconcile
from controlplane.sandbox.swarm.channel import LocalForward
from controlplane.sandbox.swarm.egress_link import SwarmNetworks
from controlplane.sandbox.swarm.fleet import RelayFleet
from controlplane.sandbox.swarm.images import SwarmTemplateImages
from controlplane.sandbox.swarm.service import sandbox_template, verify_service_hardening
from controlplane.sandbox.swarm.tool_blocks import create_with_block
from controlplane.sandbox.tool_ids import ToolIds

# The package's logger (as before the split): operators and tests read the provider's story.
log = logging.getLogger("controlplane.sandbox.swarm")

_FAILED_TASK_STATES = {"failed", "rejected", "shutdown", "complete", "orphaned", "remove"}
_NETWORK_REMOVE_S = 30.0


@dataclass
class _Remote:
    sandbox: Sandbox
    forward: LocalForward
    node: str
    service_id: str

    async def close(self) -> None:
        await self.sandbox.agent.close()
        await self.forward.close()


@dataclass
class _Placement:
    node: str


class SwarmSandboxProvider(SwarmNetworks, SandboxProvider):
    def __init__(
        self,
        config: SwarmProviderConfig,
        pool: PoolConfig,
        resources: ResourcesConfig,
        data_dir: Path,
        instance: str,
        ledger: SandboxLedger,
        templates: Iterable[TemplateConfig] = (),
    ) -> None:
        self._config = config
        self._defaults = Resources(resources.cpu, resources.memory_mb, resources.pids)
        self._tmpfs_mb = resources.tmpfs_mb
        self._instance = instance
        self._ledger = ledger
        self._state_dir = data_dir / "swarm"
        self._tool_ids = ToolIds(config.tool_uid_first, config.tool_uid_count)
        self._client = (
            docker.DockerClient(base_url=config.base_url, version="auto") if config.base_url
            else docker.from_env(version="auto")
        )
        self._api: Any = self._client.api  # docker-py's low-level client is untyped
        self._fleet = RelayFleet(self._api, config, instance)
        self._live: dict[str, _Remote] = {}
        self._cleanups = TrackedTasks()
        """Removals whose callers went away: awaited before the engine client closes."""
        self._attached: dict[str, _Remote] = {}
        """Other control planes' sandboxes this one has reached (see `attach`); their owners manage them."""
        self._attaching = asyncio.Lock()
        self._lost: dict[str, str] = {}
        self._lost_listeners: list[LostListener] = []
        self._reporting = TrackedTasks()
        """Loss reports being handled apart from the watcher, whose rounds must not wait for a session's end
        (slow on a dead node)."""
        self._watcher: asyncio.Task[None] | None = None
        self._templates = SwarmTemplateImages(config, templates, instance, pool.size)
        self._pools = RuntimePools(None, {}, pool_maker(
            pool.refill_concurrency, self._create_pooled, self.destroy, self._healthy), self._templates.pool_sizes())

    # -- naming ---------------------------------------------------------------------------------

    def _name(self, sandbox_id: str) -> str:
        return engine_name(self._instance, sandbox_id)

    def _labels(self, sandbox_id: str, session_id: str, tenant: str, template: str) -> dict[str, str]:
        labels = {
            LABEL_MANAGED: "true", LABEL_INSTANCE: self._instance, LABEL_SANDBOX: sandbox_id,
            LABEL_IMAGE: self._templates.image(template), LABEL_ROLE: "sandbox", LABEL_TEMPLATE: template,
        }
        if session_id:
            labels[LABEL_SESSION] = session_id
        if tenant:
            labels[LABEL_TENANT] = tenant
        return labels

    def node_of(self, sandbox_id: str) -> str:
        """The Swarm node id the sandbox runs on."""
        remote = self._live.get(sandbox_id)
        if remote is None:
            raise SandboxLostError(f"sandbox {sandbox_id} does not exist (any more)")
        return remote.node

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, live: Mapping[str, str]) -> ReconcileReport:
        try:
            info = await asyncio.to_thread(self._client.info)
        except docker.errors.DockerException as exc:
            raise SandboxStartError(f"the Docker engine does not answer: {exc}") from exc
        swarm = info.get("Swarm") or {}
        if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
            raise SandboxStartError("the Swarm provider needs a Swarm manager's engine (`make cluster-up` here)")
        try:
            await asyncio.to_thread(self._client.images.get, self._config.image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxStartError(f"sandbox image {self._config.image} is not on the manager; `make image`") from exc
        await self._fleet.start(self._state_dir)
        await self._templates.start(self._pools.start)  # tags first: pooled sandboxes are adopted by image
        report = await reconcile(self, live)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        self._pools.start(DEFAULT_TEMPLATE, *self._templates.ready())
        self._templates.start_pruning()
        return report

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self._templates.close()
        await self._pools.close()
        await self._reporting.wait()
        await self._cleanups.wait()
        for remote in [*self._live.values(), *self._attached.values()]:
            await remote.close()
        self._live.clear()
        self._attached.clear()
        await asyncio.to_thread(self._client.close)

    async def remove_relay(self) -> None:
        """Removes this instance's relay service, configs and secrets (the operator's teardown)."""
        api = docker.APIClient(base_url=self._config.base_url, version="auto") if self._config.base_url else (
            docker.from_env(version="auto").api
        )
        try:
            await asyncio.to_thread(self._fleet.remove_objects, api)
        finally:
            api.close()

    def pool_stats(self) -> PoolStats:
        return self._pools.stats()

    def templates(self) -> list[TemplateInfo]:
        return self._templates.infos()

    def on_lost(self, listener: LostListener) -> None:
        self._lost_listeners.append(listener)

    async def acquire(self, session_id: str, tenant: str, resources: Resources,
                      template: str = DEFAULT_TEMPLATE) -> Sandbox:
        await self._templates.wait(template)
        if resources == self._defaults and not self._config.tenant_constraints.get(tenant):
            sandbox = await self._pools.pool_for(tenant, template).take(tenant)
            if sandbox is not None:
                try:
                    await self._ledger.claim_sandbox(sandbox.id, session_id)
                except BaseException:  # out of the pool and in no session: nothing else would remove it
                    await self._cleanups.run(self.destroy(sandbox.id))
                    raise
                sandbox.from_pool = True
                return sandbox
        return await self._create(session_id, resources, tenant, template)

    async def get(self, sandbox_id: str) -> Sandbox:
        remote = self._live.get(sandbox_id)
        if remote is None:
            reason = self._lost.get(sandbox_id, "it does not exist (any more)")
            raise SandboxLostError(f"sandbox {sandbox_id} is lost: {reason}")
        return remote.sandbox

    async def attach(self, sandbox_id: str) -> Sandbox:
        """Another control plane's sandbox (they share the store), through this plane's relay on its node, which
        serves every instance's socket dirs under the node root: both planes must use the same `node_root`."""
        async with self._attaching:
            known = self._live.get(sandbox_id) or self._attached.get(sandbox_id)
            if known is not None:
                return known.sandbox
            service = await asyncio.to_thread(self._find_service, sandbox_id)
            if service is None:
                raise SandboxLostError(f"sandbox {sandbox_id} has no service in this swarm")
            owner = service["Spec"]["Labels"].get(LABEL_INSTANCE, "")
            mounts = service["Spec"]["TaskTemplate"]["ContainerSpec"].get("Mounts") or []
            source = next((m.get("Source", "") for m in mounts if m.get("Target") == AGENT_DIR), "")
            if source != self._agent_dir_source(owner, sandbox_id):
                raise SandboxLostError(
                    f"sandbox {sandbox_id}'s agent dir {source or '(none)'} is not under this control plane's "
                    f"node_root {self._config.node_root}"
                )
            node = await asyncio.to_thread(self._running_node, str(service["ID"]))
            if node is None:
                raise SandboxLostError(f"sandbox {sandbox_id}'s task is not running")
            remote = await self._connect(sandbox_id, node, str(service["ID"]), owner=owner)
            try:
                await remote.sandbox.agent.health(timeout_s=5.0)
            except SandboxError as exc:
                self._attached.pop(sandbox_id, None)
                await remote.close()
                raise SandboxLostError(f"sandbox {sandbox_id} does not answer through the relay: {exc}") from exc
            return remote.sandbox

    def _find_service(self, sandbox_id: str) -> dict[str, Any] | None:
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_SANDBOX}={sandbox_id}", f"{LABEL_ROLE}=sandbox"]}
        services = self._api.services(filters=filters)
        return services[0] if services else None

    def _running_node(self, service_id: str) -> str | None:
        tasks = self._api.tasks(filters={"service": service_id})
        return next((t["NodeID"] for t in tasks if (t.get("Status") or {}).get("State") == "running"), None)

    def _agent_dir_source(self, instance: str, sandbox_id: str) -> str:
        return f"{self._config.node_root}/{{{{.Node.ID}}}}/{instance}/{sandbox_id}"

    async def destroy(self, sandbox_id: str) -> None:
        remote = self._live.pop(sandbox_id, None)
        self._lost.pop(sandbox_id, None)
        if remote is not None:
            await remote.close()
        await asyncio.to_thread(self._remove_service_and_network, sandbox_id)
        known = self._fleet.relays
        relays = [known[remote.node]] if remote and remote.node in known else list(known.values())
        await asyncio.gather(
            *(r.client.request({"op": "remove", "instance": self._instance, "sandbox": sandbox_id}) for r in relays),
            return_exceptions=True,
        )
        await self._ledger.forget_sandbox(sandbox_id)

    def _remove_service_and_network(self, sandbox_id: str) -> None:
        name = self._name(sandbox_id)
        with contextlib.suppress(docker.errors.NotFound):
            self._api.remove_service(name)
        deadline = time.monotonic() + _NETWORK_REMOVE_S
        while True:  # the network stays in use until the task's container is gone on its node
            try:
                self._api.remove_network(name)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if time.monotonic() > deadline:
                    log.warning("network %s not removed: %s", name, exc)
                    return
                time.sleep(0.2)

    # -- creation -------------------------------------------------------------------------------

    async def _create_pooled(self, runtime: str | None, template: str) -> Sandbox:
        del runtime  # a Swarm service cannot choose one (runtime_pools.tenant_runtimes refuses it)
        return await self._create("", self._defaults, "", template)

    async def _create(self, session_id: str, resources: Resources, tenant: str, template: str) -> Sandbox:
        sandbox_id = secrets.token_hex(6)
        state: SandboxState = "claimed" if session_id else "pool"
        await self._ledger.put_sandbox(SandboxRecord(sandbox_id, self._instance, "creating", session_id, time.time()))
        creating: asyncio.Future[tuple[str, int]] | None = None
        try:
            excluded = await self._prepare_dirs(sandbox_id, template)
            creating = in_thread(create_with_block, self._tool_ids, self._api, sandbox_id, functools.partial(
                self._create_service, sandbox_id, session_id, resources, tenant, template, excluded,
            ), functools.partial(self._remove_service_and_network, sandbox_id))
            service_id, _ = await asyncio.shield(creating)
            placement = await self._wait_placed(sandbox_id, service_id)
            remote = await self._connect(sandbox_id, placement.node, service_id)
            await remote.sandbox.agent.health(timeout_s=max(1.0, self._config.start_timeout_s))
            await self._release_other_dirs(sandbox_id, placement.node)
            await self._ledger.put_sandbox(SandboxRecord(sandbox_id, self._instance, state, session_id, time.time()))
        except BaseException:
            await self._cleanups.run(after(creating, self.destroy(sandbox_id)))
            raise
        return remote.sandbox

    async def _prepare_dirs(self, sandbox_id: str, template: str) -> list[str]:
        """Makes the socket dir on every node whose relay answers and that holds the template's image; the
        others are excluded from placement."""
        request = {"op": "prepare", "instance": self._instance, "sandbox": sandbox_id}
        lacking = self._templates.lacking(template, self._fleet.relays)
        nodes = [node for node in self._fleet.relays if node not in lacking]
        if not nodes:
            raise SandboxStartError(f"no node with a relay holds template {template!r}'s image (provider.node_engines "
                                    f"lists the engines it is copied to)")
        results = await asyncio.gather(
            *(self._fleet.relays[n].client.request(request) for n in nodes), return_exceptions=True
        )
        excluded = [n for n, r in zip(nodes, results, strict=True) if isinstance(r, BaseException)]
        if len(excluded) == len(nodes):
            raise SandboxStartError(f"no node's relay answered: {results[0] if results else 'no nodes'}")
        return excluded + lacking

    async def _release_other_dirs(self, sandbox_id: str, node: str) -> None:
        request = {"op": "remove", "instance": self._instance, "sandbox": sandbox_id}
        others = [r.client for n, r in self._fleet.relays.items() if n != node]
        await asyncio.gather(*(c.request(request) for c in others), return_exceptions=True)

    def _create_service(
        self, sandbox_id: str, session_id: str, resources: Resources, tenant: str, template: str, excluded: list[str],
        tool_uid: int,
    ) -> str:
        name = self._name(sandbox_id)
        labels = self._labels(sandbox_id, session_id, tenant, template)
        network = self._api.create_network(
            name, driver="overlay", internal=True, attachable=False, labels=labels, check_duplicate=True,
        )
        labels[LABEL_TOOL_UID] = str(tool_uid)
        template = sandbox_template(
            self._config, labels, self._agent_dir_source(self._instance, sandbox_id), self._tmpfs_mb, resources,
            [*self._config.constraints, *self._config.tenant_constraints.get(tenant, []),
             *(f"node.id!={node}" for node in excluded)],
            network["Id"], tool_uid, image=labels[LABEL_IMAGE],
        )
        try:
            created = self._api.create_service(
                template, name=name, labels=labels, endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
            )
        except docker.errors.APIError as exc:
            raise HardeningError(f"the engine refused the hardened service: {exc.explanation or exc}") from exc
        service_id = str(created["ID"])
        verify_service_hardening(self._api.inspect_service(service_id), resources, network["Id"], tool_uid,
                                 self._tool_ids.owns)
        return service_id

    async def _wait_placed(self, sandbox_id: str, service_id: str) -> _Placement:
        deadline = time.monotonic() + self._config.start_timeout_s
        while True:
            tasks = await asyncio.to_thread(self._api.tasks, filters={"service": service_id})
            for task in tasks:
                status = task.get("Status") or {}
                if status.get("State") == "running":
                    return _Placement(str(task.get("NodeID", "")))
                if status.get("State") in _FAILED_TASK_STATES:
                    detail = status.get("Err") or status.get("Message")
                    raise SandboxStartError(f"sandbox {sandbox_id}'s task {status.get('State')}: {detail}")
            if time.monotonic() > deadline:
                last = tasks[0].get("Status", {}) if tasks else {}
                raise SandboxStartError(
                    f"sandbox {sandbox_id} was not running within {self._config.start_timeout_s} s "
                    f"({last.get('State', 'no task')}: {last.get('Err') or last.get('Message', '')})"
                )
            await asyncio.sleep(0.05)

    async def _connect(self, sandbox_id: str, node: str, service_id: str, owner: str = "") -> _Remote:
        """A forwarder to the sandbox's agent; `owner` names another instance whose sandbox this attaches to."""
        relay = self._fleet.relays.get(node)
        if relay is None:
            await self._fleet.refresh_nodes()
            relay = self._fleet.relays.get(node)
            if relay is None:
                raise SandboxStartError(f"sandbox {sandbox_id} runs on node {node}, which has no relay")
        forward = LocalForward(
            self._state_dir / "fwd" / f"{sandbox_id}.sock", relay.client, owner or self._instance, sandbox_id
        )
        await forward.start()
        agent = GrpcSandboxAgent(f"unix:{forward.path}", sandbox_id)
        sandbox = Sandbox(sandbox_id, agent, details={"service_id": service_id, "node_id": node})
        remote = _Remote(sandbox, forward, node, service_id)
        (self._attached if owner else self._live)[sandbox_id] = remote
        return remote

    async def _healthy(self, sandbox: Sandbox) -> bool:
        if sandbox.id not in self._live:
            return False
        try:
            await sandbox.agent.health(timeout_s=2.0)
        except SandboxError:
            return False
        return True

    # -- watching -------------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._config.watch_interval_s)
            try:
                await self._check_once()
            except Exception:
                log.exception("swarm watch round failed")

    async def _check_once(self) -> None:
        await self._fleet.refresh_nodes()
        await asyncio.gather(*(self._fleet.ping(n, r) for n, r in self._fleet.relays.items()))
        if not self._live and not self._attached:
            return
        # Taken before the engine is asked: a sandbox that joins meanwhile is not in the answer, and is not lost.
        known = [(registry, list(registry.items())) for registry in (self._live, self._attached)]
        tasks = await asyncio.to_thread(self._api.tasks, filters={"desired-state": "running"})
        running = {t.get("ServiceID") for t in tasks if (t.get("Status") or {}).get("State") == "running"}
        for registry, entries in known:
            for sandbox_id, remote in entries:
                if registry.get(sandbox_id) is not remote:
                    continue  # ended or replaced while the engine answered
                relay = self._fleet.relays.get(remote.node)
                reason = ""
                if relay is None or relay.failures >= self._config.relay_failures:
                    reason = f"its node {remote.node} stopped answering"
                elif remote.service_id not in running:
                    reason = "its task is no longer running"
                if not reason:
                    continue
                registry.pop(sandbox_id, None)
                await remote.close()
                if registry is self._live:  # an attached one is its owner's to report
                    log.warning("sandbox %s lost: %s", sandbox_id, reason)
                    self._lost[sandbox_id] = reason
                    self._reporting.start(self._report_lost(sandbox_id, f"sandbox {sandbox_id} is lost: {reason}"))

    async def _report_lost(self, sandbox_id: str, reason: str) -> None:
        """Tells the listeners (the session manager) right away, with the session the ledger says claimed the
        sandbox, instead of leaving its session to find out at its next use."""
        if not self._lost_listeners:
            return
        try:
            records = await self._ledger.list_sandboxes(self._instance)
            session_id = next((r.session_id for r in records if r.id == sandbox_id and r.state == "claimed"), "")
            for listener in self._lost_listeners:
                await listener(LostSandbox(sandbox_id, session_id, reason))
        except Exception:  # the next use still finds the sandbox lost
            log.exception("could not report sandbox %s lost", sandbox_id)
