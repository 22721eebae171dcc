"""Sub-calls of one call (`batch`): each runs through the executor under its own call id, and its
events reach the calling stream wrapped in `SubCallEvent` (the stream's `call_id` tells them apart).

Each sub-call that runs takes a slot of the tenant's `calls` quota while it runs (the calling call holds
its own): a batch of 25 entries is 25 calls, not one. An entry that finds no slot fails with the quota's
message as its own error, and the others run."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.core.calls.tool_events import CallEvent, CallStatus, Completed, Failed, StateChanged, SubCallEvent
from controlplane.core.sessions.ids import ascending
from controlplane.core.sessions.services import SubOutcome
from controlplane.core.tenants.quota import QuotaExceededError, Slot

Emit = Callable[[CallEvent], None]
RunCall = Callable[[str, str, str, Emit], Awaitable[None]]
"""(tool, args_json, call_id, emit) -> runs one call through the executor to its end."""
TakeSlot = Callable[[], Slot]
"""Takes one of the tenant's call slots, or raises QuotaExceededError."""
Refused = Callable[[str, str, str], Awaitable[None]]
"""(tool, call_id, message): a sub-call the quota refused, for the audit record."""


class ExecutorSubCalls:
    def __init__(
        self, run_call: RunCall, emit: Emit, registered: tuple[str, ...], take_slot: TakeSlot | None = None,
        refused: Refused | None = None,
    ) -> None:
        self._run_call = run_call
        self._emit = emit
        self._registered = registered
        self._take_slot = take_slot
        self._refused = refused

    def registered(self) -> list[str]:
        return list(self._registered)

    async def run(self, tool: str, args: dict[str, Any]) -> SubOutcome:
        slot: Slot | None = None
        if self._take_slot is not None:
            try:
                slot = self._take_slot()
            except QuotaExceededError as exc:
                outcome = self.refuse(tool, str(exc))
                if self._refused is not None:
                    await self._refused(tool, outcome.call_id, str(exc))
                return outcome
        try:
            return await self._run(tool, args)
        finally:
            if slot is not None:
                slot.release()

    async def _run(self, tool: str, args: dict[str, Any]) -> SubOutcome:
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
