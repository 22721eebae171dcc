"""A RunTool stream's outbox: metadata updates merge only behind a reader that lags far behind."""

from __future__ import annotations

import asyncio
import json

from sandbox.v1 import agent_pb2
from sandbox_agent.tool_calls import METADATA_BACKLOG, _Outbox


def take(outbox: _Outbox) -> agent_pb2.RunToolEvent:
    event = outbox.queue.get_nowait()
    assert event is not None
    return event


def update(n: int) -> agent_pb2.ToolMetadata:
    return agent_pb2.ToolMetadata(metadata_json=json.dumps({"n": n}))


def test_a_reader_that_keeps_up_gets_every_update() -> None:
    outbox = _Outbox(asyncio.Queue())
    seen = []
    for n in range(100):
        outbox.put_metadata(update(n))
        event = take(outbox)
        outbox.taken(event)
        seen.append(json.loads(event.metadata.metadata_json)["n"])
    assert seen == list(range(100))


def test_a_flood_behind_a_lagging_reader_holds_a_bounded_queue_with_the_latest_update_last() -> None:
    outbox = _Outbox(asyncio.Queue())
    for n in range(100_000):
        outbox.put_metadata(update(n))
    assert outbox.queue.qsize() == METADATA_BACKLOG
    events = [take(outbox) for _ in range(METADATA_BACKLOG)]
    assert [json.loads(e.metadata.metadata_json)["n"] for e in events][-1] == 99_999
    # Events other than metadata are never merged, and keep their order after the merged update.
    outbox.put(failed=agent_pb2.ToolFailed(message="x"))
    outbox.put_metadata(update(1))
    assert outbox.queue.qsize() == 2
