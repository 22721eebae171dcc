"""AbortSignal: an asyncio.Event whose setting calls back, so a call's abort is watched without a task."""

from __future__ import annotations

import asyncio
import functools

from controlplane.core.calls.abort import AbortSignal, on_abort


async def test_callbacks_run_once_when_set_and_stop_watching_works() -> None:
    signal = AbortSignal()
    seen: list[str] = []
    signal.on_set(lambda: seen.append("a"))
    stop_b = signal.on_set(lambda: seen.append("b"))
    stop_b()
    assert not signal.is_set()
    signal.set()
    signal.set()  # again: no second round
    assert seen == ["a"]
    assert signal.is_set()
    assert await asyncio.wait_for(signal.wait(), 1) is True  # still an Event for everyone else


async def test_watching_a_set_signal_calls_back_soon_and_can_be_stopped() -> None:
    signal = AbortSignal()
    signal.set()
    seen: list[str] = []
    signal.on_set(lambda: seen.append("late"))
    stop = signal.on_set(lambda: seen.append("stopped"))
    stop()
    assert seen == []  # not from inside on_set: the caller finishes setting up first
    await asyncio.sleep(0)
    assert seen == ["late"]


async def test_a_plain_event_is_watched_too() -> None:
    for stop_first in (False, True):
        event = asyncio.Event()
        seen: list[str] = []
        stop = on_abort(event, functools.partial(seen.append, "aborted"))
        await asyncio.sleep(0)
        if stop_first:
            stop()
        event.set()
        await asyncio.sleep(0.01)
        assert seen == ([] if stop_first else ["aborted"])
