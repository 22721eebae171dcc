"""The seam between sessions and wherever their sandboxes run.

A provider owns both the sandbox and the channel to its agent, so nothing above it assumes a
local socket path or a local Docker daemon.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from controlplane.core.seam.files import WorkspaceFiles
from controlplane.core.seam.messages import (
    AllowedAsk,
    BuiltinCall,
    CodeChanges,
    CommandSpec,
    CustomListing,
    ExecEvent,
    RunEvent,
    UploadSummary,
)
from controlplane.core.sessions.models import Resources
from controlplane.core.sessions.templates import DEFAULT_TEMPLATE, TemplateInfo
from controlplane.errors import FailedPreconditionError, SandboxLostError

SandboxState = Literal["creating", "pool", "claimed"]


@dataclass(frozen=True)
class AgentHealth:
    version: str
    agent_pid: int
    agent_uid: int
    tool_uid: int
    workspace: str
    uptime_ms: int
    running: int
    tool_home: str = ""


class ExecStream(abc.ABC):
    """A command running in a sandbox. Dropping it (or `abort`) stops the command's whole group."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[ExecEvent]:
        """Started, then output in order, then exactly one Exited."""

    @abc.abstractmethod
    async def write_stdin(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def close_stdin(self) -> None: ...

    @abc.abstractmethod
    async def abort(self, reason: str) -> None: ...

    @abc.abstractmethod
    def cancel(self) -> None:
        """Drops the call; the agent treats it as an abort."""


class BuiltinRun(abc.ABC):
    """A built-in tool running in a sandbox. Dropping it (or `abort`) stops whatever it started."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[RunEvent]:
        """Asks and metadata as they come, then exactly one RunResult or RunFailed."""

    @abc.abstractmethod
    async def answer(self, ask_id: int, allowed: bool, message: str = "") -> None: ...

    @abc.abstractmethod
    async def abort(self, reason: str) -> None: ...

    @abc.abstractmethod
    def cancel(self) -> None: ...

    def take_allowed(self) -> list[AllowedAsk]:
        """The asks the agent allowed by the call's `rules` since the last look; the caller audits them before
        it handles the event that came with them. Always empty for an agent that sends every ask up."""
        return []


class SandboxAgent(WorkspaceFiles):
    """The channel to one sandbox's agent."""

    @abc.abstractmethod
    async def health(self, timeout_s: float = 5.0, *, wait_for_ready: bool = True) -> AgentHealth:
        """The agent's answer; `wait_for_ready=False` fails at once on a channel that cannot connect."""
        ...

    @abc.abstractmethod
    async def exec(self, spec: CommandSpec) -> ExecStream: ...

    @abc.abstractmethod
    async def run_builtin(self, call: BuiltinCall) -> BuiltinRun:
        """Starts the call; its `rules` or `path_rules` say what the agent may settle or leave out itself."""

    @abc.abstractmethod
    async def save_output(self, name: str, content: bytes) -> str:
        """Stores a full tool output in the sandbox; returns its path there."""

    @abc.abstractmethod
    async def list_custom_tools(self, config_json: str, env: dict[str, str]) -> CustomListing:
        """The project's custom and plugin tools, loaded from the session's code snapshot in the tool hosts."""

    @abc.abstractmethod
    async def snapshot_code(self, config_json: str, env: dict[str, str]) -> CodeChanges:
        """Fixes the session's custom code as the workspace holds it now (at create, and on ReloadTools);
        FailedPreconditionError says why it could not (the previous snapshot stays then)."""

    @abc.abstractmethod
    async def run_plugin_hook(
        self, name: str, input_: dict[str, object], output: dict[str, object], timeout_s: float,
    ) -> dict[str, object]:
        """Runs the project plugins' hooks of `name` in the sandbox; their output."""

    async def start_network(self, port: int, ca_pem: bytes) -> dict[str, str]:
        """Starts the sandbox's forwarder to its session proxy on loopback `port` (0: any) and gives every process
        started from now on the proxy's environment (and a CA bundle with `ca_pem` when given); the variables.
        Again on a sandbox that has it: only the CA bundle is renewed (a restarted plane's proxy has a new CA)."""
        raise FailedPreconditionError("this sandbox cannot be given a network")

    @abc.abstractmethod
    async def upload(self, archive: bytes, path: str = "") -> UploadSummary: ...

    @abc.abstractmethod
    def download(self, path: str = "") -> AsyncIterator[bytes]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


@dataclass
class Sandbox:
    id: str
    agent: SandboxAgent
    from_pool: bool = False
    details: dict[str, str] = field(default_factory=dict)
    """Provider facts worth showing (container id, runtime)."""


@dataclass(frozen=True)
class SandboxRecord:
    """What the store remembers of a sandbox, so a restarted control plane can adopt it."""

    id: str
    instance: str
    state: SandboxState
    session_id: str = ""
    created_at: float = 0.0


class SandboxLedger(Protocol):
    """Durable sandbox records (implemented by the store)."""

    async def put_sandbox(self, record: SandboxRecord) -> None: ...

    async def claim_sandbox(self, sandbox_id: str, session_id: str) -> None: ...

    async def forget_sandbox(self, sandbox_id: str) -> None: ...

    async def list_sandboxes(self, instance: str) -> list[SandboxRecord]: ...


@dataclass
class ReconcileReport:
    adopted: list[str] = field(default_factory=list)
    """Sandboxes of live sessions that are running again under this process."""
    pooled: list[str] = field(default_factory=list)
    """Idle pool sandboxes taken back into the pool."""
    removed: list[str] = field(default_factory=list)
    """Containers, volumes or socket dirs nobody owns any more."""
    lost: list[str] = field(default_factory=list)
    """Sandboxes of live sessions that no longer exist."""


@dataclass(frozen=True)
class PoolStats:
    ready: int
    creating: int
    target: int
    hits: int
    misses: int


@dataclass(frozen=True)
class LostSandbox:
    """A provider's report that one of its sandboxes is gone, found by watching rather than by a failing call."""

    sandbox_id: str
    session_id: str
    """The session the provider's records say claimed it; "" for a pool sandbox or one it has no record of."""
    reason: str
    """The whole sentence (`sandbox X is lost: its task is no longer running`): it becomes the session's status."""


LostListener = Callable[[LostSandbox], Awaitable[None]]


class SandboxProvider(abc.ABC):
    """Creates, hands out, adopts and destroys sandboxes. It reports what becomes of them (`on_lost`); what
    becomes of their sessions is the session manager's to decide."""

    @abc.abstractmethod
    async def start(self, live: Mapping[str, str]) -> ReconcileReport:
        """Reconciles against `live` (sandbox id -> session id) and starts filling the pool."""

    @abc.abstractmethod
    async def acquire(self, session_id: str, tenant: str, resources: Resources,
                      template: str = DEFAULT_TEMPLATE) -> Sandbox:
        """A ready sandbox for the session, from `template`'s image (one of `templates()`, the caller checked):
        from the pool when its resources are the default."""

    def templates(self) -> list[TemplateInfo]:
        """The images sessions may name. Here (providers without `[[templates]]`): only the default."""
        return [TemplateInfo(DEFAULT_TEMPLATE, "", "ready", "", self.pool_stats().target)]

    @abc.abstractmethod
    async def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox, or SandboxLostError when it is gone."""

    async def attach(self, sandbox_id: str) -> Sandbox:
        """A channel to a sandbox another control plane owns (they share the store); its owner keeps
        creating, reconciling and destroying it. SandboxLostError when it cannot be reached from here."""
        raise SandboxLostError(f"sandbox {sandbox_id} belongs to another control plane; this provider cannot reach it")

    network_port: int | None = None
    """Where a sandbox's forwarder listens on its own loopback (the proxy variables name it), 0 for any free
    port; None: this provider's sandboxes cannot be given a network (a policy is refused at create)."""

    def network_socket(self, sandbox_id: str) -> str:
        """Where the session proxy of this sandbox listens: a Unix socket path on this host, which the sandbox's
        agent reaches as `egress.sock` beside its own socket. Only for providers with a `network_port`."""
        raise FailedPreconditionError(f"sandbox {sandbox_id}: this provider cannot give sandboxes a network")

    async def cpu_seconds(self, sandbox_id: str) -> float | None:
        """CPU time the sandbox has used so far, or None where this provider cannot tell (it is not measured)."""
        del sandbox_id  # these providers measure nothing
        return None

    @abc.abstractmethod
    async def destroy(self, sandbox_id: str) -> None:
        """Removes the sandbox and everything it owns; idempotent."""

    async def keeps_workspace(self, sandbox_id: str) -> bool:
        """Whether `retire` keeps this sandbox's workspace for `salvage` to read. Here: no, it goes with the sandbox,
        so its agent is the only way to the work (pausing.py then does not give up on a slow copy)."""
        del sandbox_id  # nothing of theirs outlives these providers' sandboxes
        return False

    async def retire(self, sandbox_id: str) -> None:
        """Removes a failed session's sandbox but keeps its workspace, so the user's work outlives the failure;
        `destroy` removes the workspace once the session is deleted. Here (providers whose workspace lives and
        dies with the sandbox: swarm's tmpfs, the local plane's in-process agents): the same as `destroy`."""
        await self.destroy(sandbox_id)

    async def salvage(self, sandbox_id: str) -> AsyncIterator[bytes]:
        """A retired sandbox's kept workspace as a tar, a piece at a time, read without its agent
        (core/sessions/pausing.py keeps it for a FAILED session); closing it early (a timeout) stops the read and
        removes what it made. Here (providers that keep none): there is nothing to read."""
        raise FailedPreconditionError(f"sandbox {sandbox_id}'s workspace went with it")
        yield b""  # an async generator, as the providers that read one

    def retain(self, sandbox_ids: Iterable[str]) -> None:
        """Before `start`: workspaces of these (failed, not yet deleted) sessions' sandboxes are not orphans, so
        reconciliation keeps them. Nothing to keep for providers whose workspaces die with their sandboxes."""
        del sandbox_ids  # nothing of theirs outlives these providers' sandboxes

    @abc.abstractmethod
    async def close(self) -> None:
        """Stops background work and drops idle pool sandboxes; session sandboxes stay."""

    @abc.abstractmethod
    def pool_stats(self) -> PoolStats: ...

    def on_lost(self, listener: LostListener) -> None:
        """Subscribes `listener` to the sandboxes this provider finds lost on its own (a watcher noticing a dead
        node, not a call failing). Each report is made once, after the provider has let go of the sandbox.
        Here (providers that watch nothing and report only what `start` finds): nothing is ever reported."""
        del listener  # never called: these providers' losses show in `start`'s report or in a failing `get`
