"""Composition root: settings -> store -> provider -> sessions -> gRPC server. No logic of its own."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import os
import secrets
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from controlplane import host_capacity, tenancy
from controlplane.config import (
    DockerProviderConfig,
    LimitsConfig,
    Settings,
    SwarmProviderConfig,
    upstream_environment,
)
from controlplane.core.calls import arg_worker
from controlplane.core.calls.argument_budget import ArgumentBudget
from controlplane.core.calls.executor import ToolExecutor
from controlplane.core.calls.hooks import HookBus
from controlplane.core.calls.tool_runtime import ToolRuntime
from controlplane.core.definitions.registry import Registry
from controlplane.core.permissions.asks import ApprovalStore, PermissionGate
from controlplane.core.permissions.audit import AuditLog
from controlplane.core.permissions.exec_policy import ExecGate
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.core.seam.provider import ReconcileReport, Sandbox, SandboxProvider
from controlplane.core.sessions.admission import SessionPolicy
from controlplane.core.sessions.capacity import bounded_maximum
from controlplane.core.sessions.events import BusEvent, EventBus
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Resources
from controlplane.core.sessions.services import TodoStore
from controlplane.core.sessions.templates import TemplateAccess
from controlplane.core.tenants.lifecycle import TenantAdmin
from controlplane.core.tenants.quota import TenantQuotas
from controlplane.discovery import ENDPOINT_FILE
from controlplane.egress import EgressPolicy
from controlplane.egress_proxy.accounting import EgressAccounting
from controlplane.egress_proxy.broker import CredentialBroker
from controlplane.egress_proxy.session_ca import CA_VALIDITY
from controlplane.egress_proxy.sessions import session_networks
from controlplane.errors import ConfigError
from controlplane.exec_commands import read_command
from controlplane.mcp.session import mcp_factory
from controlplane.plugins import PluginInput, load_plugins
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.server import build_server, mark_serving
from controlplane.sandbox.tool_bridge import AgentToolCalls
from controlplane.store.base import AuditWriter, Store, describe, hash_token, open_store
from controlplane.telemetry import setup as telemetry
from controlplane.tools import catalog
from controlplane.tools.description_overrides import load_descriptions
from controlplane.tools.websearch import SearchConfig
from sandbox_agent.gc_tuning import tune_after_startup

log = logging.getLogger(__name__)
DEFAULT_TOKEN_PREFIX = "ocsb_"
"""Starts every generated default-tenant token."""


def build_provider(settings: Settings, store: Store) -> SandboxProvider:
    from controlplane.sandbox.runtime_pools import tenant_runtimes

    if isinstance(settings.provider, DockerProviderConfig):
        from controlplane.sandbox.docker import DockerSandboxProvider

        return DockerSandboxProvider(
            settings.provider, settings.pool, settings.resources, settings.data_dir, settings.instance, store,
            tenant_runtimes(settings), settings.templates,
        )
    tenant_runtimes(settings)  # refuses a tenant runtime where the provider cannot honour it
    if isinstance(settings.provider, SwarmProviderConfig):
        from controlplane.sandbox.swarm.provider import SwarmSandboxProvider

        return SwarmSandboxProvider(
            settings.provider, settings.pool, settings.resources, settings.data_dir, settings.instance, store,
            settings.templates,
        )
    if settings.templates:  # a template is a Docker image built on the engine: the local provider has none
        raise ConfigError(f"[[templates]] {[t.name for t in settings.templates]} need provider.type = \"docker\" "
                          "or \"swarm\"")
    from controlplane.sandbox.local import LocalSandboxProvider

    return LocalSandboxProvider(settings.data_dir, settings.instance, store)


def session_policy(settings: Settings) -> SessionPolicy:
    r, lt = settings.resources, settings.lifetime
    return SessionPolicy(
        defaults=Resources(r.cpu, r.memory_mb, r.pids),
        maximum=bounded_maximum(Resources(r.max_cpu, r.max_memory_mb, r.max_pids), host_capacity.capacity(settings)),
        idle_timeout_s=lt.idle_timeout_s,
        max_lifetime_s=lt.max_lifetime_s,
        reap_interval_s=lt.reap_interval_s,
        max_archive_bytes=settings.server.max_message_mb * 1024 * 1024,
        max_archive_entries=settings.limits.max_archive_entries,
    )


def operator_policy(settings: Settings) -> OperatorPolicy:
    policy = OperatorPolicy(settings.policy.permission, settings.policy.tenants)
    policy.validate()
    return policy


def tool_settings(settings: Settings) -> catalog.ToolSettings:
    e, s = settings.egress, settings.search
    return catalog.ToolSettings(
        egress=EgressPolicy(allow_cidrs=tuple(e.allow_cidrs), allow_hosts=tuple(e.allow_hosts), max_bytes=e.max_bytes),
        search=SearchConfig(
            endpoint=s.endpoint, api_key=s.api_key, timeout=s.timeout_s, api_key_header=s.api_key_header,
        ),
        descriptions=load_descriptions(settings.tools.descriptions_dir, catalog.tool_ids()),
    )


def build_tools(
    sessions: SessionManager, *, approvals: ApprovalStore | None = None, audit: AuditLog | None = None,
    hooks: HookBus | None = None, policy: OperatorPolicy | None = None, settings: catalog.ToolSettings | None = None,
    todos: TodoStore | None = None, limits: LimitsConfig | None = None, quotas: TenantQuotas | None = None,
) -> ToolRuntime:
    tools = catalog.implemented(settings)
    upstream = upstream_environment()
    registry = Registry(catalog.registered(tools), env=upstream)
    hooks = hooks or HookBus()

    def sandbox_calls(sandbox: Sandbox) -> AgentToolCalls:
        return AgentToolCalls(sandbox.agent)

    if hooks.has("event"):
        async def to_plugins(event: BusEvent) -> None:
            payload = {"type": event.type, "properties": {**event.properties, "sessionID": event.session_id}}
            await hooks.trigger("event", {"event": payload}, {}, tolerant=True)

        sessions.bus.listen(to_plugins)
    pending_bytes = (limits or LimitsConfig()).max_pending_question_mb * 1024 * 1024
    gate = PermissionGate(approvals, audit, sessions.bus, hooks, max_pending_bytes=pending_bytes)
    chosen = limits or LimitsConfig()
    executor = ToolExecutor(gate, hooks, audit, quotas, arg_worker_memory_mb=chosen.arg_worker_memory_mb)
    return ToolRuntime(
        sessions, registry, executor, sandbox_calls, catalog.unregistered(tools), bus=sessions.bus, policy=policy,
        env=upstream, mcp=mcp_factory((settings or catalog.ToolSettings()).egress), todos=todos,
        max_args_bytes=(limits or LimitsConfig()).max_args_bytes,
        max_pending_question_bytes=pending_bytes,
        budget=ArgumentBudget(chosen.max_args_in_flight_mb << 20, chosen.max_args_queued_mb << 20,
                              chosen.max_args_in_flight_total_mb << 20),
    )


async def bootstrap_tenants(settings: Settings, store: Store) -> None:
    """Configured tenants are upserted; with none, a `default` tenant gets a token file (0600)."""
    stored = {r.name for r in await store.tenant_records()}
    for tenant in settings.tenants:
        if tenant.name not in stored:  # new, or deleted through the API: nothing of an earlier one carries over
            await store.purge_tenant(tenant.name)
        if bool(tenant.token) == bool(tenant.token_sha256):
            raise ConfigError(f"tenant {tenant.name!r}: set exactly one of token and token_sha256")
        await store.put_tenant(tenant.name, tenant.token_sha256 or hash_token(tenant.token or ""))
    if settings.tenants:
        return
    tokens = await store.tenant_tokens()  # revoked ones left out: a revoked default gets a new token
    if any(t.name == "default" for t in tokens.values()) and settings.token_file.exists():
        return
    # A URL-safe token starts with "-" one time in 64, which a command line's `--token TOKEN` then reads
    # as an option; the prefix also lets secret scanners recognise it.
    token = DEFAULT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(settings.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(settings.token_file, 0o600)
    if "default" not in stored:
        await store.purge_tenant("default")
    await store.put_tenant("default", hash_token(token), origin="default")
    log.info("created tenant 'default'; its token is in %s", settings.token_file)


@dataclass
class ControlPlane:
    settings: Settings
    store: Store
    sessions: SessionManager
    tools: ToolRuntime
    server: grpc.aio.Server
    port: int
    report: ReconcileReport
    audit: AuditWriter
    telemetry: telemetry.Telemetry | None = None
    tenants: TenantAdmin | None = None
    mcp_http: Any = None
    """The MCP front end over streamable HTTP (`server.mcp_listen`), when served: its `.address`."""
    egress: EgressAccounting | None = None
    """Every session proxy's connections: audit, spans, metrics and byte totals (egress_proxy/accounting.py)."""

    @property
    def address(self) -> str:
        host = self.settings.server.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"


async def start(settings: Settings) -> ControlPlane:
    _warn_if_exposed(settings)
    exporting = telemetry.configure()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.data_dir, 0o700)
    store = await open_store(settings.store.url, settings.data_dir, settings.store.pool_size)
    if settings.store.url:
        log.info("store: %s", describe(settings.store.url))
    await bootstrap_tenants(settings, store)
    tenant_admin = await tenancy.start(settings, store)
    auth = Authenticator(tenant_admin.directory)
    policy = operator_policy(settings)
    configured_tools = tool_settings(settings)  # reads tools.descriptions_dir: refused before anything starts
    settings.egress.credential_list()  # a credential's value is checked here, before anything starts
    hooks = HookBus(settings.plugins.hook_timeout_s)
    await load_plugins(settings.plugins.modules, hooks, PluginInput(settings.instance))
    bus = EventBus(settings.limits.max_event_backlog_mb * 1024 * 1024)
    # Before the sessions: a restarted plane starts adopted sessions' proxies, whose records go to the accounting.
    audit = AuditWriter(store)
    egress_accounting = EgressAccounting(audit, store)
    tenant_admin.egress = egress_accounting  # the session proxies' on_record is egress_accounting.record
    provider = build_provider(settings, store)  # an engine it cannot reach is its error, said first
    host = host_capacity.ledger(settings, store, await asyncio.to_thread(host_capacity.host_id, settings))
    networks = session_networks(settings, provider, configured_tools.egress, egress_accounting,
                                credential_broker(settings))
    sessions = SessionManager(store, provider, session_policy(settings), bus=bus, host=host, cpu_store=store,
                              networks=networks)
    tenant_admin.sessions = sessions
    sessions.templates = TemplateAccess({t.name: t.templates for t in settings.tenants})
    report = await sessions.start()
    await tenant_admin.finish_deletes()
    log.info(
        "reconciled: %d adopted, %d pooled, %d removed, %d lost",
        len(report.adopted), len(report.pooled), len(report.removed), len(report.lost),
    )
    tools = build_tools(
        sessions, approvals=store, audit=audit, hooks=hooks, policy=policy, settings=configured_tools,
        todos=store, limits=settings.limits, quotas=tenant_admin.quotas,
    )
    server, health_servicer, port = build_server(
        settings, sessions, tools, auth, tenant_admin, ExecGate(policy, audit, read_command), (store, audit)
    )
    front_end = _front_end_target(server, settings) if settings.server.mcp_listen else ""
    await server.start()
    await mark_serving(health_servicer, True)
    plane = ControlPlane(settings, store, sessions, tools, server, port, report, audit, exporting, tenant_admin)
    plane.egress = egress_accounting
    # Renamed into place: a client polling for the file (a supervisor, a test) never reads it half-written.
    partial = settings.data_dir / f".{ENDPOINT_FILE}.{os.getpid()}"
    partial.write_text(plane.address + "\n")
    os.replace(partial, settings.data_dir / ENDPOINT_FILE)
    if settings.server.mcp_listen:
        from controlplane.mcp_front import http as mcp_http

        plane.mcp_http = await mcp_http.start(settings.server.mcp_listen, front_end)
    return plane


def credential_broker(settings: Settings) -> CredentialBroker | None:
    """The proxy's TLS interception for hosts with a brokered credential (egress_proxy/broker.py), when any
    credential is configured: a session CA outlives the longest session, so a tool never meets an expired one."""
    if not settings.egress.credential_list() and not any(t.egress.credentials for t in settings.tenants):
        return None
    validity = max(CA_VALIDITY, datetime.timedelta(seconds=settings.lifetime.max_lifetime_s + 3600))
    return CredentialBroker(settings.egress.upstream_ca, ca_validity=validity)


FRONT_END_SOCKET = "mcp-front.sock"


def _front_end_target(server: grpc.aio.Server, settings: Settings) -> str:
    """Where the MCP front end, in this process, reaches the API: a Unix socket in a dir only this user may
    enter. Not the public port: with TLS there, the front end would need a certificate valid for the address
    it dials (the certificate names the public host), and the socket also saves a TCP hop per call. Callers are
    authenticated on it exactly as on the public port (the same server, the same interceptors)."""
    run = settings.data_dir / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    os.chmod(run, 0o700)
    path = run / FRONT_END_SOCKET
    if len(os.fsencode(path)) > 100:  # sun_path holds 108 bytes: a deep data dir gets a private temp dir
        path = Path(tempfile.mkdtemp(prefix="ocsb-front-")) / FRONT_END_SOCKET
    path.unlink(missing_ok=True)
    server.add_insecure_port(f"unix:{path}")
    return f"unix:{path}"


async def stop(plane: ControlPlane, grace_s: float = 2.0) -> None:
    if plane.mcp_http is not None:
        await plane.mcp_http.stop()
    await plane.server.stop(grace_s)
    if plane.tenants is not None:
        await plane.tenants.close()
    await plane.sessions.close()
    if plane.egress is not None:
        await plane.egress.close()
    await arg_worker.close_shared()  # its process ends with the plane
    await plane.audit.close()
    await plane.store.aclose()
    if plane.telemetry is not None:
        await asyncio.to_thread(plane.telemetry.shutdown)
    with contextlib.suppress(FileNotFoundError):
        (plane.settings.data_dir / ENDPOINT_FILE).unlink()


async def serve(settings: Settings) -> None:
    """Runs until SIGINT or SIGTERM."""
    plane = await start(settings)
    tune_after_startup()
    print(f"control plane serving on {plane.address} (data dir {settings.data_dir})", flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    await stop(plane)


def _warn_if_exposed(settings: Settings) -> None:
    host = settings.server.listen.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not settings.server.tls_cert:
        log.warning("listening on %s without TLS: bearer tokens cross the network in clear", host)

