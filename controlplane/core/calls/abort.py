"""A call's abort flag that can be watched without a task.

Waiting for an `asyncio.Event` takes a task (or a waiter future the event resolves); a tool call watches
its abort in two places (the executor and the sandbox bridge), and two tasks created, stepped and
cancelled per call cost more than the rest of that bookkeeping. `AbortSignal.on_set` calls back instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class AbortSignal(asyncio.Event):
    """An `asyncio.Event` that also runs callbacks, once, when it is set."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Runs `callback` when the signal is set (soon, if it already is); returns what stops watching."""
        if self.is_set():
            handle = asyncio.get_running_loop().call_soon(callback)
            return handle.cancel
        self._callbacks.append(callback)

        def stop() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return stop


def on_abort(abort: asyncio.Event, callback: Callable[[], None]) -> Callable[[], None]:
    """`callback` once `abort` is set; any Event works, an AbortSignal without a task."""
    if isinstance(abort, AbortSignal):
        return abort.on_set(callback)
    waiting = asyncio.ensure_future(abort.wait())
    waiting.add_done_callback(lambda done: None if done.cancelled() else callback())

    def stop() -> None:
        waiting.cancel()

    return stop
