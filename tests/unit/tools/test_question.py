"""The question broker: answers, dismissal, abort, ended sessions, bus events."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.calls.tool import ToolError
from controlplane.core.calls.tool_events import QuestionAsked
from controlplane.core.permissions.questions import (
    DISMISSED_MESSAGE,
    QuestionBroker,
    QuestionRejectedError,
    QuestionScope,
)
from controlplane.core.sessions.events import BusEvent, EventBus
from controlplane.errors import NotFoundError

SCOPE = QuestionScope("acme", "ses_1", "call_1", "msg_1")
ASKED = [{"question": "Q?", "header": "H", "options": []}]


async def recorded(bus: EventBus) -> list[BusEvent]:
    seen: list[BusEvent] = []

    async def listen(event: BusEvent) -> None:
        seen.append(event)

    bus.listen(listen)
    return seen


async def asking(broker: QuestionBroker, abort: asyncio.Event | None = None) -> tuple[
    asyncio.Task[list[list[str]]], list[QuestionAsked],
]:
    announced: list[QuestionAsked] = []
    task = asyncio.ensure_future(broker.ask(SCOPE, ASKED, announced.append, abort))
    await asyncio.sleep(0)
    return task, announced


async def test_reply_answers_and_publishes() -> None:
    bus = EventBus()
    seen = await recorded(bus)
    broker = QuestionBroker(bus)
    task, [asked] = await asking(broker)
    assert broker.pending("ses_1") == [asked]
    assert broker.pending("ses_2") == []
    assert broker.session_of(asked.id) == "ses_1"
    broker.reply(asked.id, [["A", "B"]])
    assert await task == [["A", "B"]]
    await asyncio.sleep(0)
    assert [(e.type, e.tenant, e.session_id) for e in seen] == [
        ("question.asked", "acme", "ses_1"), ("question.replied", "acme", "ses_1"),
    ]
    assert seen[1].properties == {"sessionID": "ses_1", "requestID": asked.id, "answers": [["A", "B"]]}
    with pytest.raises(NotFoundError):
        broker.reply(asked.id, [])
    assert broker.pending("ses_1") == []


async def test_dismiss_fails_with_upstreams_text() -> None:
    broker = QuestionBroker()
    task, [asked] = await asking(broker)
    broker.dismiss(asked.id)
    with pytest.raises(QuestionRejectedError) as err:
        await task
    assert str(err.value) == DISMISSED_MESSAGE == "The user dismissed this question"
    with pytest.raises(NotFoundError):
        broker.dismiss(asked.id)


async def test_abort_and_session_end_withdraw_the_question() -> None:
    broker = QuestionBroker()
    abort = asyncio.Event()
    task, [asked] = await asking(broker, abort)
    abort.set()
    with pytest.raises(ToolError) as err:
        await task
    assert str(err.value) == "Tool execution aborted"
    assert broker.pending("ses_1") == []
    with pytest.raises(NotFoundError):
        broker.session_of(asked.id)
    task, _ = await asking(broker)
    broker.forget_session("ses_1")
    with pytest.raises(ToolError) as err:
        await task
    assert str(err.value) == "The session ended."


async def test_a_cancelled_asker_leaves_nothing_pending() -> None:
    broker = QuestionBroker()
    task, [asked] = await asking(broker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert broker.pending("ses_1") == []
    with pytest.raises(NotFoundError):
        broker.reply(asked.id, [["late"]])
