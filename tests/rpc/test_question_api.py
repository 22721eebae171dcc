"""The `question` tool and QuestionService over real gRPC: answers from the stream and from a second
connection, dismissal, abort, tenant isolation and the bus events (in-process agents)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import question_pb2, tool_pb2
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "beta", "token": "token-beta"}]
DISMISSED = "The user dismissed this question"
TWO = [
    {"question": "Which database?", "header": "Database", "options": [
        {"label": "SQLite (Recommended)", "description": "Embedded"}, {"label": "Postgres", "description": "Server"},
    ]},
    {"question": "Which extras?", "header": "Extras", "multiple": True, "options": [
        {"label": "Cache", "description": "Redis"}, {"label": "Queue", "description": "Jobs"},
    ]},
]


plane = served_plane("local", tenants=TENANTS)


@pytest.fixture(scope="module")
async def session_id(plane: Plane) -> str:
    return (await plane.client.create_session()).id


async def until_asked(client: AsyncClient, session_id: str, count: int = 1) -> list[question_pb2.PendingQuestion]:
    for _ in range(500):
        pending = await client.pending_questions(session_id)
        if len(pending) >= count:
            return pending
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {count} pending questions")


async def drain(call: Any) -> list[tool_pb2.ToolEvent]:
    return [event async for event in call]


def output_of(pairs: str) -> str:
    return f"User has answered your questions: {pairs}. You can now continue with the user's answers in mind."


async def test_answered_from_a_second_connection_while_the_stream_waits(plane: Plane, session_id: str) -> None:
    call, outbox = plane.client.tool_call(session_id, "question", {"questions": TWO})
    events = asyncio.ensure_future(drain(call))
    async with AsyncClient(plane.plane.address, "token-alpha") as ui:
        [pending] = await until_asked(ui, session_id)
        assert pending.session_id == session_id
        assert pending.question.id.startswith("que_")
        assert json.loads(pending.question.questions_json) == TWO
        assert not events.done()  # the call waits for someone to answer
        await ui.reply_question(pending.question.id, [["Postgres"], ["Cache", "Queue"]])
        assert await ui.pending_questions(session_id) == []
        with pytest.raises(grpc.aio.AioRpcError) as err:  # answered already
            await ui.reply_question(pending.question.id, [["SQLite (Recommended)"]])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    seen = await events
    outbox.put_nowait(None)
    asked = [e for e in seen if e.WhichOneof("event") == "question"]
    assert [e.question.id for e in asked] == [pending.question.id]
    assert asked[0].call_id == pending.call_id == seen[0].call_id
    result = seen[-1].result
    assert result.title == "Asked 2 questions"
    assert result.output == output_of('"Which database?"="Postgres", "Which extras?"="Cache, Queue"')
    assert json.loads(result.metadata_json) == {"answers": [["Postgres"], ["Cache", "Queue"]], "truncated": False}


async def test_answered_on_the_stream_with_missing_and_empty_answers(plane: Plane, session_id: str) -> None:
    asked: list[tool_pb2.Question] = []

    async def answer(question: tool_pb2.Question) -> list[list[str]]:
        asked.append(question)
        return [[]]  # the second answer is missing altogether

    out = await plane.client.execute_tool(session_id, "question", {"questions": TWO}, on_question=answer)
    assert out.result is not None
    assert out.result.title == "Asked 2 questions"
    assert out.output == output_of('"Which database?"="Unanswered", "Which extras?"="Unanswered"')
    assert out.metadata["answers"] == [[]]
    assert [q.id for q in out.questions] == [asked[0].id]

    one = {"questions": [{"question": 'Say "hi"?', "header": "", "options": [], "extra": 1}]}
    out = await plane.client.execute_tool(session_id, "question", one, on_question=_answer_with([["ja, gern"]]))
    assert out.result is not None
    assert out.result.title == "Asked 1 question"
    assert out.output == output_of('"Say "hi"?"="ja, gern"')
    assert json.loads(out.questions[0].questions_json) == one["questions"]  # undeclared keys are kept


def _answer_with(answers: list[list[str]] | None) -> Any:
    async def answer(_: tool_pb2.Question) -> list[list[str]] | None:
        return answers

    return answer


async def test_dismissed_on_the_stream_and_from_another_connection(plane: Plane, session_id: str) -> None:
    out = await plane.client.execute_tool(session_id, "question", {"questions": TWO}, on_question=_answer_with(None))
    assert out.error == DISMISSED

    call, outbox = plane.client.tool_call(session_id, "question", {"questions": TWO[:1]})
    events = asyncio.ensure_future(drain(call))
    [pending] = await until_asked(plane.client, session_id)
    async with AsyncClient(plane.plane.address, "token-alpha") as ui:
        await ui.reply_question(pending.question.id, None)
    seen = await events
    outbox.put_nowait(None)
    assert seen[-1].error.message == DISMISSED
    assert [e.state.status for e in seen if e.WhichOneof("event") == "state"][-1] == tool_pb2.ToolState.ERROR


async def test_abort_withdraws_the_question(plane: Plane, session_id: str) -> None:
    call, outbox = plane.client.tool_call(session_id, "question", {"questions": TWO}, call_id="call_q_abort")
    events = asyncio.ensure_future(drain(call))
    [pending] = await until_asked(plane.client, session_id)
    assert await plane.client.cancel_tool_call(session_id, "call_q_abort")
    seen = await asyncio.wait_for(events, 2)  # well before the executor's abort grace
    outbox.put_nowait(None)
    assert seen[-1].error.message == "Tool execution aborted"
    assert await plane.client.pending_questions(session_id) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plane.client.reply_question(pending.question.id, [["Postgres"]])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_other_tenants_see_and_touch_nothing(plane: Plane, session_id: str) -> None:
    call, outbox = plane.client.tool_call(session_id, "question", {"questions": TWO[:1]})
    events = asyncio.ensure_future(drain(call))
    [pending] = await until_asked(plane.client, session_id)
    async with AsyncClient(plane.plane.address, "token-beta") as beta:
        for attempt in (beta.pending_questions(session_id), beta.reply_question(pending.question.id, [["Postgres"]]),
                        beta.reply_question(pending.question.id, None)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await attempt
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        own = await beta.create_session()
        assert await beta.pending_questions(own.id) == []
    assert [p.question.id for p in await plane.client.pending_questions(session_id)] == [pending.question.id]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plane.client.reply_question("que_unknown", [])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plane.client.pending_questions("")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await plane.client.reply_question(pending.question.id, [["SQLite (Recommended)"]])
    seen = await events
    outbox.put_nowait(None)
    assert seen[-1].result.output == output_of('"Which database?"="SQLite (Recommended)"')


async def test_bus_events_of_a_question(plane: Plane) -> None:
    session = await plane.client.create_session()
    subscription = plane.client.subscribe_events(session.id)
    received: list[tuple[str, dict[str, Any]]] = []

    async def collect() -> None:
        async for event in subscription:
            if event.type.startswith("question."):
                received.append((event.type, json.loads(event.properties_json)))

    collector = asyncio.ensure_future(collect())
    await asyncio.sleep(0.05)
    out = await plane.client.execute_tool(
        session.id, "question", {"questions": TWO[:1]}, call_id="call_bus", message_id="msg_bus",
        on_question=_answer_with([["Postgres"]]),
    )
    asked_id = out.questions[0].id
    out = await plane.client.execute_tool(session.id, "question", {"questions": TWO[:1]},
                                          on_question=_answer_with(None))
    dismissed_id = out.questions[0].id
    for _ in range(200):
        if len(received) >= 4:
            break
        await asyncio.sleep(0.01)
    subscription.cancel()
    collector.cancel()
    assert received == [
        ("question.asked", {"id": asked_id, "sessionID": session.id, "questions": TWO[:1],
                            "tool": {"messageID": "msg_bus", "callID": "call_bus"}}),
        ("question.replied", {"sessionID": session.id, "requestID": asked_id, "answers": [["Postgres"]]}),
        ("question.asked", {"id": dismissed_id, "sessionID": session.id, "questions": TWO[:1],
                            "tool": {"messageID": "", "callID": out.call_id}}),
        ("question.rejected", {"sessionID": session.id, "requestID": dismissed_id}),
    ]


async def test_question_is_listed_per_permission(plane: Plane) -> None:
    build = await plane.client.create_session()
    listed = [t.id for t in (await plane.client.list_tools(build.id)).tools]
    assert listed[:2] == ["question", "bash"]  # right after the hidden `invalid`, as upstream orders it
    schema = json.loads((await plane.client.list_tools(build.id)).tools[0].parameters_json_schema)
    assert schema["properties"]["questions"]["items"]["properties"]["options"]["items"]["ref"] == "QuestionOption"
    general = [t.id for t in (await plane.client.list_tools(build.id, agent="general")).tools]
    assert "question" not in general  # the base default denies `question`; only build and plan allow it
