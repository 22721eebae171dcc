"""What the tool runtime keeps for each session: one object per session instead of one dict per kind of thing.

The cached parts (HOME, agents, custom listing, MCP servers) go when the session ends; a running call goes
when the call ends. The object itself is dropped at the later of the two: a call can outlive its session for
a moment (the sandbox removal takes time to reach it) and must stay abortable and hear its subtasks until
then, and an ended session leaves nothing behind once its last call is over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.core.calls.tool import ToolInfo
from controlplane.core.calls.tool_events import CallEvent
from controlplane.core.permissions import permission
from controlplane.core.seam.messages import CustomListing

AgentsKey = tuple[str, str, tuple[str, ...], str]
"""The session's config, the caller's config, the skill dirs and the worktree the session's agents were made from."""


class McpSource(Protocol):
    """A session's connected MCP servers (see controlplane.mcp.session)."""

    def tools(self) -> list[ToolInfo]: ...

    def load_errors(self) -> list[tuple[str, str]]: ...

    async def close(self) -> None: ...


@dataclass
class RunningCall:
    session_id: str
    call_id: str
    events: asyncio.Queue[CallEvent | None]
    abort: asyncio.Event
    task: asyncio.Task[None] | None = None


@dataclass
class RuntimeSession:
    """One session's share of the tool runtime."""

    home: str | None = None
    """The tool user's HOME in the session's sandbox (saved outputs and plans live under it)."""
    agents: tuple[AgentsKey, dict[str, permission.Agent]] | None = None
    """The session's agents, with what they were made from (remade when that changes)."""
    custom: CustomListing | None = None
    """The custom and plugin tools the sandbox loaded at the last look."""
    mcp: asyncio.Future[McpSource | None] | None = None
    """The session's MCP servers, connected once on first use."""
    calls: dict[str, RunningCall] = field(default_factory=dict)
    """The session's running calls by call id."""
    ended: bool = False

    def drop_code(self) -> None:
        """Forgets what was taken from the session's code (listing, agents, MCP servers): the next look takes
        it again. MCP servers still connecting are closed once connected."""
        self.custom = None
        self.agents = None
        connecting, self.mcp = self.mcp, None
        if connecting is not None:
            connecting.add_done_callback(_close_mcp)

    def end(self) -> None:
        """The session ended: everything cached goes now, the running calls as they finish."""
        self.ended = True
        self.home = None
        self.drop_code()

    @property
    def finished(self) -> bool:
        """Ended, and no call of it still running: nothing of it needs keeping."""
        return self.ended and not self.calls


class RuntimeSessions:
    """The runtime's sessions by id: made on first need, dropped once `finished`."""

    def __init__(self) -> None:
        self._by_id: dict[str, RuntimeSession] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def ids(self) -> list[str]:
        return list(self._by_id)

    def get(self, session_id: str) -> RuntimeSession | None:
        return self._by_id.get(session_id)

    def of(self, session_id: str) -> RuntimeSession:
        state = self._by_id.get(session_id)
        if state is None:
            state = self._by_id[session_id] = RuntimeSession()
        return state

    def call(self, session_id: str, call_id: str) -> RunningCall | None:
        state = self._by_id.get(session_id)
        return state.calls.get(call_id) if state is not None else None

    def add_call(self, kept: RuntimeSession, running: RunningCall) -> None:
        """Holds `running` until it ends. `kept` is the share the call was made ready with: if its session ended
        meanwhile (and `kept` was dropped), it is held again until the call is over, so that the call stays
        abortable and nothing outlives it."""
        self._by_id.setdefault(running.session_id, kept).calls[running.call_id] = running

    def call_ended(self, running: RunningCall) -> None:
        state = self._by_id.get(running.session_id)
        if state is not None and state.calls.get(running.call_id) is running:
            del state.calls[running.call_id]
            self._drop_if_finished(running.session_id, state)

    def end(self, session_id: str) -> None:
        state = self._by_id.get(session_id)
        if state is not None:
            state.end()
            self._drop_if_finished(session_id, state)

    def _drop_if_finished(self, session_id: str, state: RuntimeSession) -> None:
        if state.finished and self._by_id.get(session_id) is state:
            del self._by_id[session_id]


def _close_mcp(connecting: asyncio.Future[McpSource | None]) -> None:
    if connecting.cancelled() or connecting.exception() is not None:
        return
    source = connecting.result()
    if source is not None:
        task = asyncio.ensure_future(source.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)


_closing: set[asyncio.Task[None]] = set()
"""MCP closings under way: held so that they are not collected before they finish."""
