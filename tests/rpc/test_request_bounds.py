"""Bounded request work through the public API: tool call arguments over `limits.max_args_bytes` refused
before any parsing, large ones handled off the event loop so another tenant is served meanwhile, a
workspace archive declaring a huge header refused in bounded memory, event backlogs bounded by bytes and
a tenant's pending questions bounded by bytes."""

from __future__ import annotations

import asyncio
import gzip
import json
import resource
import tarfile
import time
from typing import Any

import grpc
import pytest

from controlplane.client import AsyncClient
from controlplane.core.sessions.archive_stream import MAX_HEADER_BYTES
from controlplane.v1 import tool_pb2
from tests.planes import served_plane, tenant_clients
from tests.unit.test_archive_stream import gzip_of_zeros, header

TENANTS: list[dict[str, Any]] = [
    {"name": "flood", "token": "token-flood"},
    {"name": "quiet", "token": "token-quiet"},
]
LIMIT = 6 * 1024 * 1024

plane = served_plane("local", tenants=TENANTS, pool={"size": 0},
                     limits={"max_args_bytes": LIMIT, "max_event_backlog_mb": 2, "max_pending_question_mb": 4})


clients = tenant_clients(TENANTS)


def todos(mib: int) -> dict[str, Any]:
    item = {"content": "t" * (64 * 1024), "status": "pending", "priority": "high"}
    return {"todos": [item] * (mib * 16)}


def many_todos(mib: int) -> dict[str, Any]:
    """`mib` MiB of small items: what costs validation most per byte."""
    return {"todos": [{"content": f"t{i}", "status": "pending", "priority": "high"} for i in range(mib * 16384)]}


async def test_arguments_over_the_limit_are_refused_naming_it(clients: dict[str, AsyncClient]) -> None:
    client = clients["flood"]
    session = await client.create_session()
    args = json.dumps({"command": "echo " + "x" * (LIMIT + 1), "description": "Big"})
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.execute_tool(session.id, "bash", args)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"tool call arguments are {len(args)} bytes; the limit is {LIMIT} bytes (limits.max_args_bytes)"
    )
    # Multi-byte text counts in bytes: under the limit in characters, over it in UTF-8.
    wide = json.dumps({"command": "echo " + "é" * (LIMIT // 2 + 1), "description": "Wide"}, ensure_ascii=False)
    assert len(wide) < LIMIT
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.execute_tool(session.id, "bash", wide)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "(limits.max_args_bytes)" in (info.value.details() or "")
    done = await client.execute_tool(session.id, "bash", {"command": "echo fine", "description": "Small"})
    assert done.output.strip() == "fine"


async def test_another_tenant_is_served_while_huge_arguments_are_validated(clients: dict[str, AsyncClient]) -> None:
    flood, quiet = clients["flood"], clients["quiet"]
    busy = await flood.create_session()
    calm = await quiet.create_session()
    await quiet.list_tools(calm.id)  # warmed: the first listing reads the sandbox's custom tools
    big = many_todos(4)

    def distinct(i: int) -> dict[str, Any]:  # identical calls in a row would be asked about as a doom loop
        return {"todos": [{**big["todos"][0], "content": f"call {i}"}, *big["todos"][1:]]}
    running = [asyncio.ensure_future(flood.execute_tool(busy.id, "todowrite", distinct(i))) for i in range(8)]
    try:
        await asyncio.sleep(0.05)  # the big calls are on their way
        started = time.monotonic()
        listing = await quiet.list_tools(calm.id)
        echoed = await quiet.execute_tool(calm.id, "bash", {"command": "echo here", "description": "Echo"})
        waited = time.monotonic() - started
        still_running = sum(not call.done() for call in running)
    finally:
        outcomes = await asyncio.gather(*running)
    assert "bash" in [t.id for t in listing.tools]
    assert echoed.output.strip() == "here"
    assert all(o.result is not None and o.result.title == f"{len(big['todos'])} todos" for o in outcomes)
    # The other tenant's calls did not wait for the whole flood (they did, on the loop, before).
    assert still_running > 0, f"all 8 big calls finished before the other tenant's ({waited:.2f}s)"


async def test_an_archive_declaring_a_512_mib_pax_header_is_refused_in_bounded_memory(
    clients: dict[str, AsyncClient],
) -> None:
    flood, quiet = clients["flood"], clients["quiet"]
    huge = 512 << 20
    bomb = gzip_of_zeros(header(tarfile.XHDTYPE, huge), huge)
    calm = await quiet.create_session()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; the plane runs in this process
    started = time.monotonic()
    refusals = [asyncio.ensure_future(flood.create_session(workspace_archive=bomb)) for _ in range(2)]
    listing = await quiet.list_tools(calm.id)
    for refused in refusals:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await refused
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details() == (
            f"workspace upload refused: a PAX header declares {huge} bytes; the limit is {MAX_HEADER_BYTES}"
        )
    took = time.monotonic() - started
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert "bash" in [t.id for t in listing.tools]
    assert took < 10, took
    assert grown < 64 * 1024, f"the plane's peak memory grew by {grown // 1024} MiB"
    assert await flood.list_sessions() == []


async def test_a_refused_archive_is_answered_after_a_pause_so_a_loop_of_bombs_cannot_spin(
    clients: dict[str, AsyncClient],
) -> None:
    from controlplane.core.tenants.quota import REFUSAL_PAUSE_S

    huge = 64 << 20
    bomb = gzip_of_zeros(header(tarfile.XHDTYPE, huge), huge)
    for archive, code in ((bomb, grpc.StatusCode.RESOURCE_EXHAUSTED),
                          (gzip.compress(bomb), grpc.StatusCode.INVALID_ARGUMENT)):  # gzip in gzip
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await clients["flood"].create_session(workspace_archive=archive)
        assert info.value.code() == code, info.value.details()
        assert time.monotonic() - started >= REFUSAL_PAUSE_S * 0.9
    # Only the refused request waits: another tenant is answered meanwhile.
    held = asyncio.ensure_future(clients["flood"].create_session(workspace_archive=bomb))
    await asyncio.sleep(REFUSAL_PAUSE_S / 4)
    quiet = time.monotonic()
    await clients["quiet"].list_sessions()
    assert time.monotonic() - quiet < REFUSAL_PAUSE_S / 2
    with pytest.raises(grpc.aio.AioRpcError):
        await held
    assert await clients["flood"].list_sessions() == []


def big_question(mib: float, tag: str) -> dict[str, Any]:
    """Told apart by `tag`: identical calls in a row would be asked about as a doom loop."""
    text = "q" * int(mib * 1024 * 1024)
    return {"questions": [{"question": text, "header": tag, "options": [{"label": "Yes", "description": "y"}]}]}


async def pending(client: AsyncClient, session_id: str, count: int) -> None:
    for _ in range(500):
        if len(await client.pending_questions(session_id)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"expected {count} pending questions")


async def test_a_tenants_pending_questions_are_bounded_in_bytes(clients: dict[str, AsyncClient]) -> None:
    flood, quiet = clients["flood"], clients["quiet"]
    busy = await flood.create_session()
    calm = await quiet.create_session()
    waiting = [
        flood.tool_call(busy.id, "question", big_question(1.5, f"big {i}"), call_id=f"call_big_{i}") for i in range(2)
    ]
    drained = [asyncio.ensure_future(drain(call)) for call, _ in waiting]
    try:
        await pending(flood, busy.id, 2)
        refused = await flood.execute_tool(busy.id, "question", big_question(1.5, "one too many"))
        assert refused.error is not None
        assert "tenant flood's pending questions would hold" in refused.error, refused.error
        assert refused.error.endswith(f"the limit is {4 * 1024 * 1024} (limits.max_pending_question_mb)")
        # Another tenant's questions are counted apart.
        other, outbox = quiet.tool_call(calm.id, "question", big_question(1.5, "other"))
        other_events = asyncio.ensure_future(drain(other))
        await pending(quiet, calm.id, 1)
        [asked] = await quiet.pending_questions(calm.id)
        await quiet.reply_question(asked.question.id, [["Yes"]])
        await other_events
        outbox.put_nowait(None)
    finally:
        for i, (_, outbox) in enumerate(waiting):
            await flood.cancel_tool_call(busy.id, f"call_big_{i}")
            outbox.put_nowait(None)
        await asyncio.gather(*drained)
    # Withdrawn questions give their room back.
    again, outbox = flood.tool_call(busy.id, "question", big_question(1.5, "again"), call_id="call_again")
    events = asyncio.ensure_future(drain(again))
    await pending(flood, busy.id, 1)
    await flood.cancel_tool_call(busy.id, "call_again")
    outbox.put_nowait(None)
    await events


async def drain(call: Any) -> list[Any]:
    return [event async for event in call]


async def test_a_subscriber_that_never_reads_is_dropped_by_bytes_not_count(clients: dict[str, AsyncClient]) -> None:
    flood = clients["flood"]
    busy = await flood.create_session()
    stalled = flood.subscribe_events(busy.id)
    await flood.execute_tool(busy.id, "todowrite", {"todos": []})
    first = await asyncio.wait_for(stalled.read(), 10)  # subscribed; from now on nothing is read
    assert first is not grpc.aio.EOF
    # 40 events of 1 MiB: far under 4096 events, over the 2 MiB backlog and what the transport buffers.
    for i in range(40):
        big = todos(1)
        big["todos"][0] = {**big["todos"][0], "content": f"{i}"}  # no doom loop
        await flood.execute_tool(busy.id, "todowrite", big)

    async def read_all() -> None:
        while await stalled.read() is not grpc.aio.EOF:
            pass
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(read_all(), 30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.details() == (
        f"event subscription dropped: more than 4096 events or {2 * 1024 * 1024} bytes of events were not read in time"
    )


async def test_a_tenants_pending_permission_asks_are_bounded_in_bytes(clients: dict[str, AsyncClient]) -> None:
    flood = clients["flood"]
    busy = await flood.create_session(config_json=json.dumps({"permission": {"edit": "ask"}}))

    def write(i: int) -> dict[str, Any]:
        return {"filePath": f"big{i}.txt", "content": f"{i}\n" + "w" * (1536 * 1024)}

    waiting = [flood.tool_call(busy.id, "write", write(i), call_id=f"call_write_{i}") for i in range(2)]
    try:
        for call, _ in waiting:  # each stream's first events, up to its permission request
            while True:
                event = await asyncio.wait_for(call.read(), 20)
                assert isinstance(event, tool_pb2.ToolEvent), event
                if event.WhichOneof("event") == "permission_request":
                    break
        refused = await flood.execute_tool(busy.id, "write", write(2))
        assert refused.error is not None
        assert "tenant flood's pending permission asks would hold" in refused.error, refused.error
        assert refused.error.endswith(f"the limit is {4 * 1024 * 1024} (limits.max_pending_question_mb)")
    finally:
        for i, (call, outbox) in enumerate(waiting):
            await flood.cancel_tool_call(busy.id, f"call_write_{i}")
            outbox.put_nowait(None)
            while await call.read() is not grpc.aio.EOF:
                pass
