"""Questions a tool puts to the user (`question`, `plan_exit`), answered from any connection.

A question is announced on the asking call's stream and published on the bus (`question.asked`);
whoever answers first wins: a `question_reply` on that stream or `QuestionService.ReplyQuestion`
from another connection. Dismissing fails the call with upstream's `Question.RejectedError` text;
aborting the call withdraws the question.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controlplane.core.calls.tool import ToolError
from controlplane.core.calls.tool_events import QuestionAsked
from controlplane.core.sessions.events import EventBus
from controlplane.core.sessions.held_bytes import TenantBytes, approximate_size
from controlplane.core.sessions.ids import ascending
from controlplane.errors import NotFoundError

DISMISSED_MESSAGE = "The user dismissed this question"
ABORTED = "Tool execution aborted"
Answers = list[list[str]]


class QuestionRejectedError(ToolError):
    """The user dismissed the question (upstream stops the agent's loop on it)."""

    def __init__(self) -> None:
        super().__init__(DISMISSED_MESSAGE)


@dataclass(frozen=True)
class QuestionScope:
    """Who asks: the call the question belongs to."""

    tenant: str
    session_id: str
    call_id: str
    message_id: str = ""


@dataclass
class _Pending:
    tenant: str
    request: QuestionAsked
    waiter: asyncio.Future[Answers]


MAX_PENDING_BYTES = 64 * 1024 * 1024
"""What one tenant's unanswered questions may hold together (estimated): thirty 3 MiB questions fit,
four hundred do not."""


class QuestionBroker:
    def __init__(self, bus: EventBus | None = None, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self._bus = bus or EventBus()
        self._pending: dict[str, _Pending] = {}
        self._held = TenantBytes(max_pending_bytes, "pending questions", "limits.max_pending_question_mb")

    async def ask(
        self, scope: QuestionScope, questions: list[dict[str, Any]], announce: Callable[[QuestionAsked], None],
        abort: asyncio.Event | None = None,
    ) -> Answers:
        """Waits for the answers (one list of labels per question).

        Raises QuestionRejectedError when dismissed, ToolError(ABORTED) when the call is aborted and
        ResourceExhaustedError when the tenant's pending questions would hold too much.
        """
        with self._held.holding(scope.tenant, approximate_size(questions)):
            return await self._ask(scope, questions, announce, abort)

    async def _ask(
        self, scope: QuestionScope, questions: list[dict[str, Any]], announce: Callable[[QuestionAsked], None],
        abort: asyncio.Event | None,
    ) -> Answers:
        request = QuestionAsked(
            id=ascending("que"), session_id=scope.session_id, questions=questions, call_id=scope.call_id,
            message_id=scope.message_id,
        )
        waiter: asyncio.Future[Answers] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = _Pending(scope.tenant, request, waiter)
        stopper = asyncio.ensure_future(abort.wait()) if abort is not None else None
        try:
            self._bus.publish(
                "question.asked", scope.tenant, scope.session_id, id=request.id, sessionID=scope.session_id,
                questions=questions, tool={"messageID": scope.message_id, "callID": scope.call_id},
            )
            announce(request)
            watched: list[asyncio.Future[Any]] = [waiter] if stopper is None else [waiter, stopper]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                self._bus.publish(
                    "question.rejected", scope.tenant, scope.session_id, sessionID=scope.session_id,
                    requestID=request.id, reason="aborted",
                )
                raise ToolError(ABORTED)
            return waiter.result()
        finally:
            if stopper is not None:
                stopper.cancel()
            self._pending.pop(request.id, None)
            if not waiter.done():
                waiter.cancel()

    def pending(self, session_id: str) -> list[QuestionAsked]:
        """The session's unanswered questions, oldest first."""
        return [p.request for p in self._pending.values() if p.request.session_id == session_id]

    def session_of(self, request_id: str) -> str:
        pending = self._pending.get(request_id)
        if pending is None:
            raise NotFoundError(f"no pending question {request_id!r}")
        return pending.request.session_id

    def reply(self, request_id: str, answers: Answers) -> None:
        """Answers a pending question; NotFound when none is pending under that id."""
        pending = self._take(request_id)
        self._bus.publish(
            "question.replied", pending.tenant, pending.request.session_id, sessionID=pending.request.session_id,
            requestID=request_id, answers=answers,
        )
        pending.waiter.set_result([list(a) for a in answers])

    def dismiss(self, request_id: str) -> None:
        pending = self._take(request_id)
        self._bus.publish(
            "question.rejected", pending.tenant, pending.request.session_id, sessionID=pending.request.session_id,
            requestID=request_id,
        )
        pending.waiter.set_exception(QuestionRejectedError())

    def _take(self, request_id: str) -> _Pending:
        pending = self._pending.pop(request_id, None)
        if pending is None or pending.waiter.done():
            raise NotFoundError(f"no pending question {request_id!r}")
        return pending

    def forget_session(self, session_id: str) -> None:
        """An ended session's questions fail their calls."""
        for request_id, pending in list(self._pending.items()):
            if pending.request.session_id == session_id:
                del self._pending[request_id]
                if not pending.waiter.done():
                    pending.waiter.set_exception(ToolError("The session ended."))
