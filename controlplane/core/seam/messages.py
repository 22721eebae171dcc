"""A command run in a sandbox, as the domain sees it (independent of the agent's wire format)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controlplane.core.calls.spooled import Spooled
from controlplane.core.calls.tool_log import ToolLogged

if TYPE_CHECKING:  # asks.py reaches this module through the session manager: only its type is needed here
    from controlplane.core.permissions.asks import LocalRules


@dataclass(frozen=True)
class CommandSpec:
    argv: list[str] = field(default_factory=list)
    """Program and arguments, no shell. Exactly one of argv and command is set."""
    command: str = ""
    """A script for /bin/bash -c."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    timeout_ms: int = 0
    stdin: bool = False
    merge_stderr: bool = False
    kill_grace_ms: int = 0
    server: bool = False
    """A long-lived server serving later calls (a local MCP server): see ExecStart.server."""


@dataclass(frozen=True)
class Started:
    pid: int


@dataclass(frozen=True)
class Output:
    stream: str  # "stdout" | "stderr"
    data: bytes


@dataclass(frozen=True)
class Exited:
    exit_code: int
    signal: int = 0
    timed_out: bool = False
    aborted: bool = False
    duration_ms: int = 0
    abort_reason: str = ""


ExecEvent = Started | Output | Exited


@dataclass(frozen=True)
class UploadSummary:
    files: int
    directories: int
    symlinks: int
    bytes: int
    skipped: list[str]


@dataclass(frozen=True)
class BuiltinCall:
    """A built-in tool call for the sandbox agent; `args` are already validated."""

    tool: str
    args: dict[str, object]
    session_id: str
    message_id: str
    call_id: str
    agent: str
    extra: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    custom: bool = False
    """Run by the sandbox's tool host (a custom or plugin tool), not the built-in of that id."""
    rules: LocalRules | None = None
    """The agent settles the asks these rules allow itself (reporting them: `BuiltinRun.take_allowed`) and
    leaves out what their denies cover (grep, glob, list)."""
    path_rules: LocalRules | None = None
    """Set instead of `rules` when every ask must go up (a `permission.ask` hook wants to see them): the
    agent only leaves out what these rules deny, and never allows by them."""


@dataclass(frozen=True)
class CustomToolSpec:
    """A custom or plugin tool as the sandbox's tool host loaded it."""

    id: str
    description: str
    parameters: dict[str, object]
    source: str  # CUSTOM | PLUGIN
    origin: str
    init_ms: float


@dataclass(frozen=True)
class CustomListing:
    tools: list[CustomToolSpec]
    load_errors: list[tuple[str, str]]
    """(origin, message) each."""
    hooks: list[str]
    """Hook names the project's plugins define."""
    skills: list[tuple[str, str]] = field(default_factory=list)
    """(name, description) of the session's skills, in upstream's order, before any permission filter."""
    skill_dirs: list[str] = field(default_factory=list)
    """Where the session's skills are (upstream's `Skill.dirs()`): its agents read there without asking."""
    config_json: str = ""
    """The session's opencode.json as the project plugins' `config` hooks left it; empty when no plugin has one."""
    worktree: str = "/"
    """The session's worktree as the sandbox last found it: the plan agent's plan-file rule is relative to it."""
    logs: list[ToolLogged] = field(default_factory=list)
    """What the tool and plugin files printed while loading (bounded in the sandbox)."""


@dataclass(frozen=True)
class CodeChanges:
    """What a new code snapshot of a session holds that the previous one did not (sandbox paths)."""

    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunAsk:
    """The tool needs a permission; answer with `BuiltinRun.answer(ask_id, ...)`."""

    ask_id: int
    permission: str
    patterns: list[str]
    always: list[str]
    metadata: dict[str, object]
    checks: list[str] = field(default_factory=list)
    """PermissionAsk.checks."""
    opaque: bool = False
    """PermissionAsk.opaque."""


@dataclass(frozen=True)
class AllowedAsk:
    """An ask the agent settled itself by the call's `rules`, reported so it is audited as if the gate had."""

    permission: str
    patterns: list[str]
    checks: list[str] = field(default_factory=list)
    opaque: bool = False


@dataclass(frozen=True)
class RunMetadata:
    title: str | None
    metadata: dict[str, object] | None


@dataclass(frozen=True)
class RunResult:
    title: str
    output: str
    metadata: dict[str, object]
    attachments: list[tuple[str, str, str]]
    """(mime, data url, filename) each."""
    spooled: Spooled | None = None
    """Set when the output was too large to travel: `output` is its head, the agent saved the whole of it."""


@dataclass(frozen=True)
class RunFailed:
    message: str


RunEvent = RunAsk | RunMetadata | RunResult | RunFailed | ToolLogged
