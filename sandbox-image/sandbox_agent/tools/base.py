"""What every built-in tool run by the agent gets and returns.

A tool module exposes `async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput`.
`args` were already validated (and defaulted) by the control plane against the tool's schema.
A failure the model should read is raised as `ToolError(message)` with the exact text.
Everything that touches the filesystem goes through `ctx.io(...)` (it runs in a thread whose
filesystem identity is the tool user's) or, for short bounded work, `ctx.io_now(...)` (the same identity
on the loop's thread), and every program through `ctx.run(...)`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sandbox_agent.errors import AgentError
from sandbox_agent.process import Execution
from sandbox_agent.saved_outputs import OutputDir, SpooledText

if TYPE_CHECKING:
    from sandbox_agent.custom.skills import SkillScan
    from sandbox_agent.lsp.servers import SessionServers

T = TypeVar("T")


IO_NOW_BYTES = 64 * 1024
"""A regular file (or a text to write) up to this size is handled on the loop's thread (`io_now`)."""


def stat_or_none(path: str) -> os.stat_result | None:
    """os.stat, or None where the path cannot be stat'ed (run it through `io` or `io_now`)."""
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


class ToolError(AgentError):
    """The tool call failed; `str(exc)` is exactly what the model reads."""


@dataclass
class Attachment:
    mime: str
    url: str  # data:{mime};base64,...
    filename: str = ""


@dataclass
class ToolOutput:
    title: str
    output: str
    metadata: dict[str, Any] = field(default_factory=dict)
    attachments: list[Attachment] = field(default_factory=list)
    spooled: SpooledText | None = None
    """Set when the output was too large to keep: `output` is then its head only (see saved_outputs)."""


@dataclass(frozen=True)
class ProcessResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class Runner(Protocol):
    """How a tool touches the sandbox: as the tool user, never as the agent."""

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs a blocking filesystem function with the tool user's filesystem identity."""
        ...

    def io_now(self, fn: Callable[..., T], *args: Any) -> T:
        """The same on the event loop's own thread: only for short, bounded work (a small file, a short
        command's scan), where the trip to an io thread and back costs more than the work itself."""
        ...

    async def run(self, argv: list[str], *, cwd: str, abort: asyncio.Event | None = None) -> ProcessResult:
        """Runs a program to completion as the tool user (stdin is /dev/null)."""
        ...

    async def start(self, argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float | None,
                    merge_stderr: bool) -> Execution:
        """Starts a program as the tool user in its own process group and returns it running."""
        ...


class RuleView(Protocol):
    """The session's permission rules as the control plane evaluates them (agent, approvals, operator)."""

    def action(self, permission: str, pattern: str) -> str:
        """allow, deny or ask: the last matching rule's action."""
        ...

    def may_deny(self, permission: str) -> bool:
        """Whether any rule could deny `permission` (a fast way out for the common all-allow case)."""
        ...


AskFn = Callable[..., Awaitable[None]]
"""ask(permission, patterns, always, metadata[, checks, opaque]): returns when allowed, raises ToolError otherwise.

`checks`: more texts the rules must allow, not shown to whoever replies (a bash command's normalised forms);
`opaque`: some command is not known before it runs, so the strictest rule decides too. Only bash passes them,
so an asker for other tools (custom tool hosts, test recorders) may take the four arguments alone."""
MetadataFn = Callable[[str | None, dict[str, Any] | None], Awaitable[None]]
"""metadata(title, metadata): streams a live update of the running call."""


class SessionState:
    """What the agent remembers per session between calls."""

    def __init__(self) -> None:
        self.file_times = FileTimes()
        self.loaded_instructions: set[str] = set()
        """Instruction files (AGENTS.md, ...) already injected by `read` in this session."""
        self.lsp: SessionServers | None = None
        """The session's language servers, created by the `lsp` tool on first use."""
        self.worktree: str | None = None
        """The session's git worktree, found on its first call: fixed for the session, as upstream fixes it per
        instance (a `.git` created later does not move it)."""
        self.skills: SkillScan | None = None
        """The skills of the session's code snapshot (custom/snapshot.py); None: the `skill` tool scans."""


class FileTimes:
    """Per-session record of when each file was last read, plus a lock per file (edit/write).

    Both are kept per file however its absolute path is spelled (`/w/./a` is `/w/a`): tools show the path
    as the model gave it, but a read of one spelling counts for an edit of another.
    """

    def __init__(self) -> None:
        self._read: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed: dict[str, float] = {}
        """Files (or whole directories) the caller changed through the files API, and when."""

    def read(self, path: str, when: float) -> None:
        self._read[os.path.normpath(path)] = when

    def last_read(self, path: str) -> float | None:
        return self._read.get(os.path.normpath(path))

    def changed(self, path: str, when: float) -> None:
        """The caller (not a model) changed `path`, or everything under it, at `when`: as with any change made
        outside OpenCode, a read before it no longer allows a write. Upstream sees such a change only through the
        file's mtime, which a write within 50 ms of the read escapes; recording it makes the check certain."""
        self._changed[os.path.normpath(path)] = when

    def changed_since_read(self, path: str) -> bool:
        normal = os.path.normpath(path)
        read = self._read.get(normal)
        if read is None or not self._changed:
            return False
        while True:
            if self._changed.get(normal, -1.0) >= read:
                return True
            parent = os.path.dirname(normal)
            if parent == normal:
                return False
            normal = parent

    def lock(self, path: str) -> asyncio.Lock:
        return self._locks.setdefault(os.path.normpath(path), asyncio.Lock())


@dataclass
class ToolContext:
    session_id: str
    message_id: str
    call_id: str
    agent: str
    directory: str
    """The project directory every relative path is resolved against (the workspace)."""
    worktree: str
    """The git worktree; "/" when the project is not a git repository."""
    ask: AskFn
    metadata: MetadataFn
    runner: Runner
    state: SessionState
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for commands (the `shell.env` hook's output)."""
    rules: RuleView | None = None
    """The call's rules when the control plane sent them: used only to leave out what a deny covers (grep,
    glob, list, instruction files), never to allow. None: nothing is left out."""
    outputs: OutputDir | None = None
    """Where a tool saves an output too large to keep in memory (None: it keeps it whole)."""

    async def io(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.runner.io(fn, *args)

    def io_now(self, fn: Callable[..., T], *args: Any) -> T:
        return self.runner.io_now(fn, *args)

    @property
    def file_times(self) -> FileTimes:
        return self.state.file_times

    async def run(self, argv: list[str], *, cwd: str) -> ProcessResult:
        return await self.runner.run(argv, cwd=cwd, abort=self.abort)


ToolRun = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]
