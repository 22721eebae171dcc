"""controlplane.v1.QuestionService: pending questions answered from any connection."""

from __future__ import annotations

from typing import Any

from controlplane.core.calls.tool_events import QuestionAsked
from controlplane.core.calls.tool_runtime import ToolRuntime
from controlplane.errors import InvalidArgumentError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import unary
from controlplane.rpc.tool_service import question_message
from controlplane.v1 import question_pb2, question_pb2_grpc


def answers_of(answers: Any) -> list[list[str]]:
    """Repeated `QuestionAnswer` -> one list of labels per question."""
    return [list(a.labels) for a in answers]


def _pending(q: QuestionAsked) -> question_pb2.PendingQuestion:
    return question_pb2.PendingQuestion(
        question=question_message(q), session_id=q.session_id, call_id=q.call_id, message_id=q.message_id,
    )


class QuestionService(question_pb2_grpc.QuestionServiceServicer):
    def __init__(self, runtime: ToolRuntime, auth: Authenticator) -> None:
        self._runtime = runtime
        self._auth = auth

    @unary
    async def ListPendingQuestions(
        self, request: question_pb2.ListPendingQuestionsRequest, context: Any
    ) -> question_pb2.ListPendingQuestionsResponse:
        tenant = self._auth.tenant_of(context)
        if not request.session_id:
            raise InvalidArgumentError("session_id is required")
        pending = await self._runtime.pending_questions(tenant.name, request.session_id)
        return question_pb2.ListPendingQuestionsResponse(questions=[_pending(q) for q in pending])

    @unary
    async def ReplyQuestion(
        self, request: question_pb2.ReplyQuestionRequest, context: Any
    ) -> question_pb2.ReplyQuestionResponse:
        tenant = self._auth.tenant_of(context)
        if not request.request_id:
            raise InvalidArgumentError("request_id is required")
        await self._runtime.reply_question(
            tenant.name, request.request_id, answers_of(request.answers), request.dismissed,
        )
        return question_pb2.ReplyQuestionResponse()
