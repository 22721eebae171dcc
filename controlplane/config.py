"""Operator configuration: a TOML file plus `CONTROLPLANE_*` environment overrides.

The environment wins over the file; nested keys use `__` (`CONTROLPLANE_POOL__SIZE=4`). Unknown
keys are errors.

This module is the control plane's one reader of the environment for what configures it: `load_settings`
(`CONTROLPLANE_CONFIG` and every `CONTROLPLANE_*` setting), `client_environment` (the command line's
`CONTROLPLANE_TARGET`, `CONTROLPLANE_TOKEN` and `CONTROLPLANE_ADMIN_TOKEN`) and `upstream_environment` (the
`OPENCODE_*` flags upstream's tools read, taken by the tool registry and runtime). The environment is read
elsewhere only where a library or another process owns the variables, namely:

- controlplane/telemetry/setup.py reads OpenTelemetry's own `OTEL_*` variables with the SDK's meaning
  (`OTEL_SDK_DISABLED`, `OTEL_{TRACES,METRICS}_EXPORTER`, `OTEL_EXPORTER_OTLP_[{signal}_]ENDPOINT` and
  `..._PROTOCOL`), and the SDK's resource and the OTLP exporters it builds read the rest of `OTEL_*`
  themselves: that is the standard way to point any OpenTelemetry program at a collector.
- controlplane/discovery.py reads `CONTROLPLANE_TARGET`, `CONTROLPLANE_TOKEN` and `CONTROLPLANE_ADMIN_TOKEN` (as
  `client_environment` does)
  and checks for any other `CONTROLPLANE_*` setting, so that a client command with neither a config file nor
  such a setting skips importing pydantic-settings (a fifth of a second of the CLI's start).
- controlplane/__main__.py sets `GRPC_ENABLE_FORK_SUPPORT` (default 0) for gRPC's C core, which reads it.
- sandbox_agent.event_loop reads `OCSB_EVENT_LOOP` (uvloop or asyncio) for the control plane and the agent
  alike: one choice for both processes, made where the loop is made.
- docker.from_env() (sandbox/docker.py, the Swarm provider) reads `DOCKER_HOST`, `DOCKER_TLS_VERIFY` and
  `DOCKER_CERT_PATH`, Docker's own way to name its engine, unless `provider.base_url` is set.
- controlplane/sandbox/swarm/relay.py (`main`) is the Swarm relay, a process of its own on each node: it
  reads its `OCSB_*` variables, which the control plane sets when it creates the relay service.
- Child processes (the local provider's agents, losetup, openssl) inherit the environment as it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from controlplane.config_base import _Closed
from controlplane.config_egress import EgressConfig
from controlplane.config_lifecycle import LifetimeConfig, SnapshotsConfig, TemplateConfig
from controlplane.discovery import ADMIN_TOKEN_FILE, DEFAULT_DATA_DIR, DEFAULT_LISTEN, TOKEN_FILE
from controlplane.errors import ConfigError
from controlplane.tenant_egress import TenantEgressConfig


class ReserveConfig(_Closed):
    """What every session is promised (host admission: the sum never exceeds `[host]`'s capacity)."""

    cpu: float = Field(default=0.005, gt=0)
    """Idle sessions use well under half a percent of a CPU: 200 per CPU."""
    memory_mb: int = Field(default=64, gt=0)


class HostConfig(_Closed):
    """The host's capacity for admission; unset: the machine's CPUs and its memory less memory_reserve_mb."""

    cpu: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, gt=0)
    memory_reserve_mb: int = Field(default=2048, ge=0)
    """Kept for the host itself (the control plane, the engine, page cache)."""
    disk_reserve_mb: int = Field(default=2048, ge=0)
    """Kept free on the data dir's filesystem: a create is refused when the free space, less this and what
    creates in flight claim, cannot hold the new session's workspace image and first write."""
    id: str | None = Field(default=None, min_length=1, max_length=200)
    """Names the host in the store's reservations, shared by every control plane whose sandboxes run on it;
    unset: the Docker engine's ID (the swarm's cluster ID), or the machine id under the local provider."""
    lease_s: float = Field(default=30.0, ge=1.0)
    """A plane's reservations count while its lease, renewed every third of this, is live: one that dies
    stops counting this long after its last renewal."""


class ResourcesConfig(_Closed):
    """Per-session limits: the default a session gets and the most it may ask for."""

    cpu: float = 1.0
    """CPUs per session."""
    memory_mb: int = 1024
    """Memory (and memory+swap) limit per session, MiB."""
    pids: int = 512
    """Process limit per session."""
    max_cpu: float = 4.0
    """Never more than the host's CPUs in effect (host admission bounds it)."""
    max_memory_mb: int = 8192
    """Never more than the host's memory capacity in effect."""
    max_pids: int = 4096
    tmpfs_mb: int = 256
    """Size of the /tmp tmpfs (counts against the memory limit)."""
    shm_mb: int = Field(default=64, ge=1)
    """Size of /dev/shm (a tmpfs, noexec/nosuid/nodev; counts against the memory limit)."""
    disk_mb: int = Field(default=2048, ge=0)
    """Workspace size per session, MiB: an ext4 image per session on a loop device (the Docker provider
    needs root, losetup and mkfs.ext4 on the host). 0: an unbounded Docker volume on the host's Docker disk."""
    reserve: ReserveConfig = Field(default_factory=ReserveConfig)
    output_budget_mb: int = Field(default=0, ge=0)
    """What the saved full outputs of truncated tool results may take together in a session's /tmp, MiB (the
    oldest are removed first). 0: a quarter of the session's /tmp."""


class DockerProviderConfig(_Closed):
    """One hardened container per session on a Docker engine."""

    type: Literal["docker"] = "docker"
    image: str = "ocsb-sandbox:latest"
    """Image built by `make image`."""
    base_url: str | None = None
    """Docker endpoint; unset means DOCKER_HOST or the local socket."""
    runtime: str | None = None
    """OCI runtime (e.g. `runsc` for gVisor); unset means the engine's default."""
    start_timeout_s: float = 30.0
    """How long a new container's agent may take to answer."""
    tool_uid_first: int = 200000
    tool_uid_count: int = 65536
    """The ids sandboxes' tool processes run as, a block of 8 per sandbox (sandbox/tool_ids.py); no host account
    may use one (checked at start). Every control plane sharing an engine may use the same range."""
    tenant_cpu_weight: bool | None = None
    """Each tenant's sandboxes under a cgroup parent of its own, every tenant of equal CPU weight (so ten busy
    sandboxes of one tenant weigh what another's one does; sandbox/tenant_cgroups.py). Unset: on where the engine
    uses the cgroupfs driver and the control plane runs as root on its host, else off with a warning; true: the
    control plane refuses to start without it; false: off (every sandbox weighs the same)."""
    global_dir: Path | None = None
    """The operator's global tools dir: a host dir mounted read-only at /opt/opencode/global in every sandbox,
    upstream's global config dir (`~/.config/opencode`). Its `tool/`, `plugin/` and `skill/` come before a
    project's own, which win a name collision. It must exist at start and be world-readable."""


class LocalProviderConfig(_Closed):
    """The real agent run as a host process per sandbox: no isolation, for fast tests only."""

    type: Literal["local"] = "local"


class SwarmProviderConfig(_Closed):
    """One hardened one-replica service per session on a Docker Swarm (see docs/swarm.md)."""

    type: Literal["swarm"] = "swarm"
    image: str = "ocsb-sandbox:latest"
    """Must be present on every node (the engine does not pull it)."""
    base_url: str | None = None
    """A manager's Docker endpoint; unset means DOCKER_HOST or the local socket."""
    start_timeout_s: float = 60.0
    """How long a new service's agent may take to answer (scheduling included)."""
    relay_port: int = Field(default=50071, ge=1, le=65535)
    """TCP port of this instance's per-node relay (mutual TLS) on every node's address."""
    node_root: str = "/var/lib/ocsb/run"
    """Directory present on every node; the agents' socket dirs are made below it by the relay."""
    workspace_mb: int = Field(default=1024, ge=16)
    """Size of the /workspace tmpfs, or of its disk with `workspace_disk`."""
    workspace_disk: bool | Literal["auto"] = "auto"
    """/workspace on a `workspace_mb` ext4 disk on its node (a loop device, made through the node's engine by a
    helper container holding CAP_SYS_ADMIN and the loop devices alone) that outlives the task: a FAILED session's
    work is kept (lifetime.retain_s), and the workspace allows exec. Only nodes whose engine the plane reaches (the
    manager, `node_engines`) run sessions then. "auto": on when, at start, every ready node matching `constraints`
    is reached and the helper works there, else off (a tmpfs) with a log line naming the nodes (docs/swarm.md)."""
    disk_root: str = "/var/lib/ocsb/disks"
    """Where each node keeps its workspace disk images (`workspace_disk`), made by the helper when missing."""
    reserve_fraction: float = Field(default=0.25, gt=0, le=1)
    """Share of a session's cpu/memory limit reserved with the scheduler."""
    constraints: list[str] = Field(default_factory=list)
    """Placement constraints of every session, e.g. ["node.labels.ocsb.sandboxes==true"]."""
    tenant_constraints: dict[str, list[str]] = Field(default_factory=dict)
    """Extra constraints per tenant name (tenant placement through node labels)."""
    spread: str = ""
    """A placement preference to spread over, e.g. "node.labels.zone"."""
    node_engines: list[str] = Field(default_factory=list)
    """Docker endpoints of the other nodes (unix://, tcp://, ssh://): the `[[templates]]` images built on the
    manager are copied there (no registry). A node not listed runs no template's sessions (docs/templates.md)."""
    watch_interval_s: float = Field(default=1.0, gt=0)
    """How often tasks and relays are checked; a lost node fails its sessions within a few of these."""
    relay_failures: int = Field(default=3, ge=1)
    """Consecutive failed relay pings after which a node's sandboxes count as lost."""
    tool_uid_first: int = 200000
    tool_uid_count: int = 65536
    """As the Docker provider's: a block of 8 ids per sandbox, unique across the swarm (the services' labels,
    sandbox/swarm/tool_blocks.py). No account on any node may use one (checked on the manager's host at start)."""


ProviderConfig = Annotated[
    DockerProviderConfig | LocalProviderConfig | SwarmProviderConfig, Field(discriminator="type")
]


class PoolConfig(_Closed):
    size: int = Field(default=2, ge=0)
    """Ready sandboxes kept for CreateSession; 0 disables the pool."""
    refill_concurrency: int = Field(default=2, ge=1)
    """Sandboxes created at once while refilling."""


class ServerConfig(_Closed):
    listen: str = DEFAULT_LISTEN
    """host:port of the public gRPC API."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_message_mb: int = 64
    """Largest request (workspace archives travel in CreateSession)."""
    mcp_listen: str = ""
    """host:port of the MCP front end over streamable HTTP (`/mcp/SESSION_ID`, the tenant's bearer token);
    empty: not served. Loopback unless behind TLS termination: MCP's HTTP carries the token in clear."""


class ExecConfig(_Closed):
    default_timeout_ms: int = 120_000
    """Timeout of SandboxService.Exec when the request sets none."""
    max_timeout_ms: int = 3_600_000


class PolicyConfig(_Closed):
    """Operator permission rules, in opencode.json's `permission` format, evaluated after a
    project's rules and a session's approvals: an operator deny always wins."""

    permission: dict[str, Any] | str = Field(default_factory=dict)
    """For every tenant."""
    tenants: dict[str, dict[str, Any] | str] = Field(default_factory=dict)
    """Per tenant name, applied after the global rules."""

    @field_validator("permission")
    @classmethod
    def _global_not_nested(cls, rules: dict[str, Any] | str) -> dict[str, Any] | str:
        if isinstance(rules, dict) and "permission" in rules:
            raise ValueError("[policy.permission.permission] nests the rules once too deep: put them directly under "
                             '[policy.permission] (e.g. bash = "ask")')
        return rules

    @field_validator("tenants")
    @classmethod
    def _tenants_not_nested(cls, tenants: dict[str, dict[str, Any] | str]) -> dict[str, dict[str, Any] | str]:
        # No tool asks a permission named "permission": such a key is a table nested one level too deep, whose
        # rules would otherwise be accepted and never match anything.
        for name, rules in tenants.items():
            if isinstance(rules, dict) and "permission" in rules:
                raise ValueError(f"[policy.tenants.{name}.permission] is not a table of rules: put tenant "
                                 f"{name!r}'s rules directly under [policy.tenants.{name}] (e.g. bash = \"deny\")")
        return tenants


class PluginsConfig(_Closed):
    """Operator plugins: Python hooks run in the control plane around every tool call."""

    modules: list[str] = Field(default_factory=list)
    """Importable module names, or `entrypoint:NAME` for an entry point of group `ocsandbox.plugins`,
    in load order. Each exposes `plugin(input)` (sync or async) returning {hook name: async hook}."""
    hook_timeout_s: float = Field(default=10.0, gt=0)
    """Time limit of one hook invocation."""


class SearchConfig(_Closed):
    """The websearch/codesearch provider (an Exa-compatible JSON-RPC endpoint). Never sent into a sandbox."""

    endpoint: str = ""
    api_key: str = ""
    api_key_header: str = "x-api-key"
    timeout_s: float | None = Field(default=None, gt=0)
    """None keeps each tool's own (websearch 25 s, codesearch 30 s)."""


class ToolsConfig(_Closed):
    """The built-in tools as the model is shown them."""

    descriptions_dir: Path | None = None
    """A directory of `<tool id>.txt` files, each replacing that built-in tool's description (the platform's
    own words by default), e.g. for a site that wants upstream's exact prompt text. `${name}` placeholders
    are filled as in the built-in texts. Read and checked at start: a file naming no built-in tool, an empty
    or unreadable file, or any other entry is an error."""


class StoreConfig(_Closed):
    """Where durable state lives. Control planes that share a PostgreSQL database serve the same tenants and
    sessions (see docs/state.md); each needs its own `instance` name."""

    url: str = ""
    """`postgresql://user:password@host:port/db` (or `?host=/socket/dir`), or `sqlite:///path/file.db`;
    empty: the SQLite file `controlplane.db` in the data dir."""
    pool_size: int = Field(default=10, ge=1)
    """Most PostgreSQL connections this control plane opens."""

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        from controlplane.store.base import check_url

        try:
            return check_url(url)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc


class LimitsConfig(_Closed):
    """Bounds on what a request may make the control plane and a sandbox do."""

    max_archive_entries: int = Field(default=50_000, ge=1)
    """Most entries (files, directories, links) a CreateSession workspace archive may hold; more is
    RESOURCE_EXHAUSTED before any sandbox is touched."""
    max_args_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    """Largest tool call argument object (JSON, bytes); larger is INVALID_ARGUMENT before any parsing.
    0: no limit beyond server.max_message_mb."""
    max_args_in_flight_mb: int = Field(default=8, ge=0)
    """Large tool call arguments (64 KiB and up) one tenant's running calls may hold together (a call alone
    always runs); a call past it waits for room. 0: no limit."""
    max_args_queued_mb: int = Field(default=32, ge=0)
    """Large arguments one tenant's calls waiting for room may hold; the call past it is RESOURCE_EXHAUSTED.
    0: no limit."""
    max_args_in_flight_total_mb: int = Field(default=24, ge=0)
    """Large arguments all tenants' running calls may hold together; past it a call waits its turn. An 8 MiB
    list of small todo items peaks at about 190 MiB of the plane's memory while it runs. 0: no limit."""
    arg_worker_memory_mb: int = Field(default=512, ge=0)
    """Address space of the process that parses and validates large arguments (an 8 MiB todo list takes
    about 220 MiB); a call that needs more fails, no other does. 0: no limit."""
    max_event_backlog_mb: int = Field(default=16, ge=0)
    """Unread events one subscription may hold (estimated size); past it the subscription ends with
    RESOURCE_EXHAUSTED, as past 4096 events. 0: bounded by count only."""
    max_pending_question_mb: int = Field(default=64, ge=0)
    """What one tenant's unanswered questions may hold together, and (apart) its pending permission asks
    (whose metadata carries diffs); the one past it fails its call with ResourceExhaustedError. 0: no limit."""


class QuotaConfig(_Closed):
    """What one tenant may hold at once; a key left out is unlimited (unless the global `[quota]` sets it).
    Beyond it a request is RESOURCE_EXHAUSTED. -1 lifts a limit the global `[quota]` sets."""

    sessions: int | None = Field(default=None, ge=-1)
    """Live sessions (a `task` child session shares its parent's sandbox and is not counted)."""
    cpu: float | None = Field(default=None, ge=-1)
    """CPUs reserved by live sessions (the sum of their cpu limits)."""
    memory_mb: int | None = Field(default=None, ge=-1)
    """Memory reserved by live sessions, MiB (the sum of their memory limits)."""
    disk_mb: int | None = Field(default=None, ge=-1)
    """Workspace disk reserved by live sessions, MiB (resources.disk_mb each)."""
    calls: int | None = Field(default=None, ge=-1)
    """Concurrent tool calls (ExecuteTool streams) and Execs."""
    subscriptions: int | None = Field(default=None, ge=-1)
    """Concurrent event subscriptions."""


class TenantConfig(_Closed):
    name: str
    token: str | None = None
    """The bearer token in clear; prefer token_sha256."""
    token_sha256: str | None = None
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    """This tenant's quota, over the global `[quota]`; AdminService.SetQuota can change it at run time."""
    runtime: str | None = None
    """OCI runtime of every session of this tenant (`runsc`: gVisor), instead of `provider.runtime`; the Docker
    provider keeps a warm pool per runtime. Other providers refuse it (sandbox/runtime_pools.py)."""
    egress: TenantEgressConfig = Field(default_factory=dict, validate_default=True)
    """The cap on its sessions' networks (controlplane/tenant_egress.py, docs/egress.md)."""
    templates: list[str] | None = None
    """The `[[templates]]` (and `default`, the sandbox image itself) this tenant may use; unset: all of them."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_", env_nested_delimiter="__", extra="forbid")

    data_dir: Path = Path(os.path.expanduser(DEFAULT_DATA_DIR))
    """SQLite store, per-sandbox socket dirs and the default tenant's token."""
    instance: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9-]{0,30}$")
    """Names this control plane on every label; reconciliation touches only its own."""
    provider: ProviderConfig = Field(default_factory=DockerProviderConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    host: HostConfig = Field(default_factory=HostConfig)
    lifetime: LifetimeConfig = Field(default_factory=LifetimeConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    exec: ExecConfig = Field(default_factory=ExecConfig)
    tenants: list[TenantConfig] = Field(default_factory=list)
    """Tenants and their tokens; with none, a `default` tenant is created on first start. A tenant once
    declared and then removed from this list is revoked at the next start."""
    quota: QuotaConfig = Field(default_factory=QuotaConfig)
    """Every tenant's default quota; a tenant's own `quota` overrides it key by key."""
    templates: list[TemplateConfig] = Field(default_factory=list)
    """Sandbox images built from the operator's Dockerfiles (or prebuilt) that a session may name."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    egress: EgressConfig = Field(default_factory=EgressConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    snapshots: SnapshotsConfig = Field(default_factory=SnapshotsConfig)

    @model_validator(mode="after")
    def _templates_known(self) -> Settings:
        names = [t.name for t in self.templates]
        if len(set(names)) != len(names):
            raise ValueError(f"template names must be unique: {sorted(n for n in set(names) if names.count(n) > 1)}")
        for tenant in self.tenants:
            unknown = sorted(set(tenant.templates or ()) - {"default", *names})
            if unknown:
                raise ValueError(f"tenant {tenant.name!r} names templates that are not declared: {unknown} "
                                 f"(declared: {['default', *names]})")
        return self

    @property
    def token_file(self) -> Path:
        return self.data_dir / TOKEN_FILE

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / ADMIN_TOKEN_FILE


def load_settings(config_file: Path | None = None, **overrides: object) -> Settings:
    """Settings from `config_file` (or $CONTROLPLANE_CONFIG), the environment and `overrides`."""
    path = config_file or (Path(os.environ["CONTROLPLANE_CONFIG"]) if os.environ.get("CONTROLPLANE_CONFIG") else None)
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")

    class _FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=path)

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
            if path is not None:
                sources += (TomlConfigSettingsSource(settings_cls),)
            return sources

    try:
        loaded = _FileSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    return Settings.model_validate(loaded.model_dump())


@dataclass(frozen=True)
class ClientEnvironment:
    """What the command line's client commands take from the environment when no flag gives it."""

    target: str | None
    """`CONTROLPLANE_TARGET`: the server's address."""
    token: str | None
    """`CONTROLPLANE_TOKEN`: the bearer token."""
    admin_token: str | None = None
    """`CONTROLPLANE_ADMIN_TOKEN`: the admin token (`controlplane tenant ...`)."""


def client_environment(env: Mapping[str, str] = os.environ) -> ClientEnvironment:
    return ClientEnvironment(target=env.get("CONTROLPLANE_TARGET") or None, token=env.get("CONTROLPLANE_TOKEN") or None,
                             admin_token=env.get("CONTROLPLANE_ADMIN_TOKEN") or None)


UPSTREAM_PREFIX = "OPENCODE_"


def upstream_environment(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The `OPENCODE_*` variables, as upstream's tools read them (the registry's flags, `OPENCODE_PERMISSION`).
    Taken when the tools are built: a plane started after a change sees it."""
    return {key: value for key, value in env.items() if key.startswith(UPSTREAM_PREFIX)}

