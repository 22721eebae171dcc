"""Sub-calls of one call (`batch`): each runs through the executor under its own call id, and its
events reach the calling stream wrapped in `SubCallEvent` (the stream's `call_id` tells them apart)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.core.calls.tool_events import CallEvent, CallStatus, Completed, Failed, StateChanged, SubCallEvent
from controlplane.core.sessions.ids import ascending
from controlplane.core.sessions.services import SubOutcome

Emit = Callable[[CallEvent], None]
RunCall = Callable[[str, str, str, Emit], Awaitable[None]]
"""(tool, args_json, call_id, emit) -> runs one call through the executor to its end."""


class ExecutorSubCalls:
    def __init__(self, run_call: RunCall, emit: Emit, registered: tuple[str, ...]) -> None:
        self._run_call = run_call
        self._emit = emit
        self._registered = registered

    def registered(self) -> list[str]:
        return list(self._registered)

    async def run(self, tool: str, args: dict[str, Any]) -> SubOutcome:
        call_id = ascending("call")
        ended: list[Completed | Failed] = []

        def forward(event: CallEvent) -> None:
            if isinstance(event, Completed | Failed):
                ended.append(event)
            self._emit(SubCallEvent(call_id, tool, event))

        await self._run_call(tool, json.dumps(args, ensure_ascii=False), call_id, forward)
        last = ended[-1] if ended else Failed("Tool execution aborted")
        if isinstance(last, Completed):
            return SubOutcome(call_id, tool, result=last.result)
        return SubOutcome(call_id, tool, error=last.message)

    def refuse(self, tool: str, message: str) -> SubOutcome:
        call_id = ascending("call")
        self._emit(SubCallEvent(call_id, tool, StateChanged(CallStatus.ERROR)))
        self._emit(SubCallEvent(call_id, tool, Failed(message)))
        return SubOutcome(call_id, tool, error=message)
