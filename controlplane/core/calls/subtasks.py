"""Subtasks of the `task` tool: child sessions on the parent's sandbox, run by the client's own loop.

The control plane does not run models. A `task` call opens (or resumes) a child session, tells the
client through a `subtask` event which session to drive with which agent and prompt, and waits here
until the client hands back the subagent's final text (on the call's stream or from another
connection) or reports a failure. Aborting the task call aborts every call running in the child.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.core.calls.tool import ToolError, ToolInfo
from controlplane.core.calls.tool_events import CallEvent, SubtaskRequested
from controlplane.core.permissions.permission import Agent, Rule, Ruleset
from controlplane.core.sessions.events import EventBus
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.models import Session
from controlplane.errors import NotFoundError

ABORTED = "Tool execution aborted"
CHILD_ABORT_GRACE_S = 2.5
"""How long an aborted task waits for its child's calls to end (below the executor's own grace)."""


# --- the rules of a child session ----------------------------------------------------------------


def primary_tools(config: Mapping[str, Any]) -> list[str]:
    """`experimental.primary_tools`: tools only primary agents are offered."""
    experimental = config.get("experimental")
    tools = experimental.get("primary_tools") if isinstance(experimental, Mapping) else None
    return [t for t in tools if isinstance(t, str)] if isinstance(tools, list) else []


def child_session_rules(agent: Agent, primary: Iterable[str]) -> Ruleset:
    """The session rules upstream gives a session made by `task`, evaluated after the agent's.

    Todo tools are denied; `task` too unless the subagent's own rules mention it; primary tools
    are allowed (yet hidden from the listing, see `hidden_in_child`).
    """
    rules = [Rule("todowrite", "*", "deny"), Rule("todoread", "*", "deny")]
    if not any(rule.permission == "task" for rule in agent.permission):
        rules.append(Rule("task", "*", "deny"))
    return rules + [Rule(tool, "*", "allow") for tool in primary]


def hidden_in_child(agent: Agent, primary: Iterable[str]) -> set[str]:
    """Tools the subagent's prompt switches off (upstream's per-prompt `tools` flags)."""
    hidden = {"todowrite", "todoread", *primary}
    if not any(rule.permission == "task" for rule in agent.permission):
        hidden.add("task")
    return hidden


# --- tools bound to the calling session --------------------------------------------------------


@dataclass(frozen=True)
class CallerScope:
    """The calling session as a session-bound tool sees it."""

    tenant: str
    session: Session
    agents: Mapping[str, Agent]
    """Every agent the session's config defines, by name."""
    caller: Agent
    subtasks: Subtasks
    skills: tuple[tuple[str, str], ...] = ()
    """(name, description) of the session's skills as its sandbox last listed them."""


@dataclass(frozen=True)
class SessionBoundTool(ToolInfo):
    """A tool whose description or behaviour depends on the calling session (`task`).

    The runtime replaces it by `bind(scope)` before listing or running it; `init` alone gives a
    session-free definition.
    """

    bind: Callable[[CallerScope], ToolInfo] | None = None


def bound(tool: ToolInfo, scope: CallerScope) -> ToolInfo:
    if isinstance(tool, SessionBoundTool) and tool.bind is not None:
        return tool.bind(scope)
    return tool


# --- waiting for the client ---------------------------------------------------------------------


class CallControl(Protocol):
    """What the subtask registry needs from the runtime that runs calls."""

    def announce(self, session_id: str, call_id: str, event: CallEvent) -> None:
        """Puts `event` on the running call's stream."""
        ...

    def abort_calls(self, session_id: str) -> list[asyncio.Task[None]]:
        """Aborts every call running in the session; returns their tasks."""
        ...


@dataclass
class _Waiting:
    tenant: str
    request: SubtaskRequested
    answer: asyncio.Future[str]


class Subtasks:
    """Open subtasks by child session id (one at a time per child)."""

    def __init__(self, sessions: SessionManager, bus: EventBus, calls: CallControl) -> None:
        self._sessions = sessions
        self._bus = bus
        self._calls = calls
        self._waiting: dict[str, _Waiting] = {}

    async def open_child(self, scope: CallerScope, agent: str, description: str, task_id: str) -> tuple[Session, bool]:
        """The child to run in: the caller's live child `task_id` when there is one, else a new one.

        Returns (child, resumed).
        """
        if task_id:
            found = self._sessions.live_child(scope.session.id, task_id)
            if found is not None and found.tenant == scope.tenant:
                if found.id in self._waiting:
                    raise ToolError(f"Task {task_id} is still running; wait for its result before resuming it")
                return found, True
        title = f"{description} (@{agent} subagent)"
        return await self._sessions.create_child(scope.session.id, agent, title), False

    async def run(self, tenant: str, call_session_id: str, call_id: str, request: SubtaskRequested,
                  abort: asyncio.Event, announce: Callable[[CallEvent], None] | None = None) -> str:
        """Hands the subtask to the client and returns the subagent's final text.

        Raises ToolError with the client's message when it reports a failure, and ABORTED when
        the task call is aborted (after aborting the child's running calls).
        """
        child = request.session_id
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[child] = _Waiting(tenant, request, answer)
        stopper: asyncio.Future[bool] = asyncio.ensure_future(abort.wait())
        try:
            self._bus.publish(
                "subtask.started", tenant, child, sessionID=child, parentID=request.parent_session_id,
                callID=call_id, agent=request.agent, description=request.description, resumed=request.resumed,
            )
            if announce is not None:
                announce(request)
            else:
                self._calls.announce(call_session_id, call_id, request)
            either: list[asyncio.Future[Any]] = [answer, stopper]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                await self._cancel_child(tenant, child)
                raise ToolError(ABORTED)
            return answer.result()
        finally:
            stopper.cancel()
            if self._waiting.get(child) is not None and self._waiting[child].answer is answer:
                del self._waiting[child]
            if not answer.done():
                answer.cancel()

    async def _cancel_child(self, tenant: str, child: str) -> None:
        tasks = self._calls.abort_calls(child)
        self._bus.publish("session.cancelled", tenant, child, sessionID=child, calls=len(tasks))
        if tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), CHILD_ABORT_GRACE_S)

    def complete(self, tenant: str, session_id: str, text: str, error: str = "") -> None:
        """The client's answer for the subtask running in child `session_id`: its text, or an error."""
        waiting = self._waiting.get(session_id)
        if waiting is None or waiting.tenant != tenant or waiting.answer.done():
            raise NotFoundError(f"no subtask is waiting for a result in session {session_id!r}")
        if error:
            waiting.answer.set_exception(ToolError(error))
        else:
            waiting.answer.set_result(text)
        self._bus.publish(
            "subtask.completed", tenant, session_id, sessionID=session_id,
            parentID=waiting.request.parent_session_id, error=error,
        )

    def waiting(self, tenant: str, parent_session_id: str = "") -> list[SubtaskRequested]:
        """Open subtasks of the tenant (of one parent session when given)."""
        return [
            w.request for w in self._waiting.values()
            if w.tenant == tenant and (not parent_session_id or w.request.parent_session_id == parent_session_id)
        ]

    def forget_session(self, session_id: str) -> None:
        """A child that ended can no longer answer: its task call fails."""
        waiting = self._waiting.get(session_id)
        if waiting is not None and not waiting.answer.done():
            waiting.answer.set_exception(ToolError(f"The subagent's session {session_id} ended before it answered."))
