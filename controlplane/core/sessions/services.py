"""What control-plane tools get from the runtime beyond a plain call: todos, questions, sub-calls.

Protocols only (no store, no transport): the runtime fills `SessionServices` per call, the
executor binds the parts that belong to one call (asking a question, running sub-calls).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from controlplane.core.calls.tool import ToolResult
    from controlplane.core.calls.tool_events import CallEvent
    from controlplane.core.permissions.questions import QuestionBroker

Todo = dict[str, Any]
AskQuestions = Callable[[list[dict[str, Any]]], Awaitable[list[list[str]]]]
"""Asks the user `questions` (the `question` tool's items); returns one list of labels per question."""
Publish = Callable[..., None]
"""Publishes a bus event of the call's session: `publish(type, **properties)`."""


class TodoStore(Protocol):
    """Todo lists by session id (the SQLite store implements it)."""

    async def get_todos(self, session_id: str) -> list[Todo]: ...

    async def put_todos(self, session_id: str, todos: list[Todo]) -> None: ...


class MemoryTodos:
    """Todo lists kept in memory only (tests, planes without a store)."""

    def __init__(self) -> None:
        self._lists: dict[str, list[Todo]] = {}

    async def get_todos(self, session_id: str) -> list[Todo]:
        return list(self._lists.get(session_id, []))

    async def put_todos(self, session_id: str, todos: list[Todo]) -> None:
        self._lists[session_id] = list(todos)


@dataclass(frozen=True)
class SubOutcome:
    """How one sub-call ended: exactly one of `result` and `error` is set."""

    call_id: str
    tool: str
    result: ToolResult | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None


class SubCalls(Protocol):
    """Other tools of the session run on behalf of one call (`batch`), each under its own call id,
    its events on the calling stream."""

    def registered(self) -> list[str]:
        """Built-in ids the registry lists for the session (for an unnamed model), in order."""
        ...

    async def run(self, tool: str, args: dict[str, Any]) -> SubOutcome:
        """Runs `tool` through the executor (validation, hooks, permissions, truncation)."""
        ...

    def refuse(self, tool: str, message: str) -> SubOutcome:
        """Records a sub-call that may not run: it ends at once with `message` as its error."""
        ...


def _no_publish(type_: str, **properties: Any) -> None:
    """Without a bus nothing listens."""


@dataclass(frozen=True)
class SessionServices:
    todos: TodoStore | None = None
    publish: Publish = _no_publish
    plan_path: str = ""
    """Absolute path of the session's plan file in the sandbox (the plan agent writes it)."""
    registered: tuple[str, ...] = ()
    """Built-in ids the registry lists for the session (for an unnamed model), in order."""
    questions: QuestionBroker | None = None
    raw_args: dict[str, Any] | None = None
    """Bound per call by the executor: the arguments as sent, before validation and hooks (key
    order as given, which upstream's outputs keep since its tools receive the raw arguments)."""
    ask_questions: AskQuestions | None = None
    """Bound per call by the executor."""
    subcalls: SubCalls | None = None
    """Bound per call by the executor."""
    announce: Callable[[CallEvent], None] | None = None
    """Bound per call by the executor: puts an event on the call's own stream (a batch entry's too)."""
