"""Many calls of one streaming RPC carried over one long-lived stream (RunTools, ExecMany).

A new gRPC call costs more than the messages of a short call, so the control plane keeps one stream per
sandbox and numbers its calls. Each call here runs exactly as over its own RPC: its requests arrive in
order, `cancel` or the end of the stream is what cancelling that RPC would be, and an `AgentError` it
raises ends it with the status that RPC would have ended with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sandbox_agent.errors import AgentError
from sandbox_agent.output_credit import Credits

Inner = TypeVar("Inner")
"""One request of a single call (RunToolRequest, ExecRequest)."""
Event = TypeVar("Event")
"""One event of a single call."""
Outer = TypeVar("Outer")
"""One event on the shared stream."""


@dataclass(frozen=True)
class Routed(Generic[Inner]):
    """What a request on the shared stream says: the call, and its request or its cancellation."""

    call: int
    request: Inner | None
    """None: the call is cancelled (or, with `credit`, given more room)."""
    trace: dict[str, str]
    credit: int = 0
    """With `start`: the call's window of bytes (0: no limit); alone: more room (output_credit)."""


call_aside: ContextVar[Callable[..., None]] = ContextVar("call_aside")
"""In a call's task (and the tasks it starts): sends a message of the shared stream for the call beside its events
(`wrap`'s fields, no event), without waiting on its window: what the call's stdin credit goes down in."""
MAX_QUEUED = 64
"""Events (an output chunk is at most 64 KiB) queued on the shared stream before the calls feeding it wait."""
CallRunner = Callable[[AsyncIterator[Inner], dict[str, str]], AsyncIterator[Event]]
Wrap = Callable[..., Outer]
"""wrap(call, event=..., done=..., error=..., code=...) -> the shared stream's event."""


async def multiplex(
    requests: AsyncIterator[Routed[Inner]], opens: Callable[[Inner], bool], run_call: CallRunner[Inner, Event],
    wrap: Wrap[Outer], keep: set[asyncio.Task[Any]], *, cancel_on_hang_up: bool, is_final: Callable[[Event], bool],
    hello: Outer | None = None,
) -> AsyncIterator[Outer]:
    """The shared stream's events; `keep` holds calls still finishing after the stream went away.

    A call's last event carries `done` itself when `is_final` knows it for the last (`exited`, `result`):
    one message less per call; otherwise `done` follows on its own once the call's events end.

    A call is hung up by its `cancel` or by the end of the shared stream. `cancel_on_hang_up`: its task is
    cancelled, as gRPC cancels the handler of a cancelled call (Exec, whose requests may end early and
    normally); otherwise its requests end, which the call reads as an abort (RunTool).

    `hello` goes first, once the first request arrived (before any event of a call): what the agent offers.
    """
    events: asyncio.Queue[Outer | None] = asyncio.Queue()
    room = asyncio.Event()
    """Set while the stream keeps up: a call waits for it after queueing an event, so a loud command behind a
    slow reader pauses (its Execution stops reading its pipes) instead of piling its output up here."""
    room.set()
    inboxes: dict[int, asyncio.Queue[Inner | None]] = {}
    tasks: dict[int, asyncio.Task[None]] = {}
    credits = Credits()

    async def put(event: Outer) -> None:
        events.put_nowait(event)
        while events.qsize() >= MAX_QUEUED:
            room.clear()
            await room.wait()

    def hang_up(number: int) -> None:
        credits.hang_up(number)
        if cancel_on_hang_up:
            tasks[number].cancel()
        else:
            inboxes[number].put_nowait(None)

    async def one(number: int, inbox: asyncio.Queue[Inner | None], trace: dict[str, str]) -> None:
        async def requests_of_call() -> AsyncIterator[Inner]:
            while (request := await inbox.get()) is not None:
                yield request

        call_aside.set(lambda **fields: events.put_nowait(wrap(number, **fields)))
        try:
            done = False
            async for event in run_call(requests_of_call(), trace):
                done = is_final(event)
                wrapped = wrap(number, event=event, done=done)
                await credits.spend(number, wrapped)
                await put(wrapped)
            if not done:
                events.put_nowait(wrap(number, done=True))
        except AgentError as exc:
            events.put_nowait(wrap(number, done=True, error=str(exc), code=exc.status))
        finally:
            del inboxes[number], tasks[number]
            credits.drop(number)
            events.put_nowait(None)  # wakes the stream up, in case this was the last call

    async def dispatch() -> None:
        said_hello = False
        try:
            async for routed in requests:
                if hello is not None and not said_hello:
                    said_hello = True
                    events.put_nowait(hello)
                if routed.request is None and routed.credit:
                    credits.top_up(routed.call, routed.credit)
                elif routed.call in inboxes:
                    if routed.request is None:
                        hang_up(routed.call)
                    else:
                        inboxes[routed.call].put_nowait(routed.request)
                elif routed.request is not None and opens(routed.request):
                    inbox = inboxes[routed.call] = asyncio.Queue()
                    inbox.put_nowait(routed.request)
                    credits.open(routed.call, routed.credit)
                    task = tasks[routed.call] = asyncio.ensure_future(one(routed.call, inbox, routed.trace))
                    keep.add(task)
                    task.add_done_callback(keep.discard)
                # Anything else is for a call that already ended, as a late message on a finished call.
        finally:
            hang_up_all()
            events.put_nowait(None)

    def hang_up_all() -> None:
        for number in list(inboxes):
            hang_up(number)

    reader = asyncio.ensure_future(dispatch())
    try:
        while not (reader.done() and not inboxes and events.empty()):
            event = await events.get()
            if events.qsize() < MAX_QUEUED // 2:
                room.set()
            if event is not None:
                yield event
    finally:
        reader.cancel()
        hang_up_all()


async def routed(requests: AsyncIterator[Any]) -> AsyncIterator[Routed[Any]]:
    """The shared stream's requests (RunToolsRequest, ExecManyRequest: `call`, `request`, `cancel`, `trace`)."""
    async for request in requests:
        if request.cancel:
            yield Routed(request.call, None, dict(request.trace))
        elif request.HasField("request") or not request.credit:
            yield Routed(request.call, request.request, dict(request.trace), request.credit)
        else:  # only more room for the call
            yield Routed(request.call, None, {}, request.credit)


def is_start(request: Any) -> bool:
    """Whether a single call's request opens it (`start` in its `msg` oneof, as RunTool and Exec have it)."""
    return bool(request.WhichOneof("msg") == "start")
