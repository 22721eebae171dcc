"""The executor's use of the argument worker (arg_worker): a large call's arguments parsed, fingerprinted and
validated in the worker process, unpacked here piece by piece in a thread.

Every method answers None where the worker cannot help (arguments that are not a JSON object, a tool that is
not found, a custom tool's own model, a job that failed in it): the executor then does the same work in a
thread, with the same result, so the two paths differ only in where the CPU time is spent. A worker that ran
out of memory or died with the job raises arg_worker.ArgWorkerError: the call fails, it is not retried here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.core.calls import arg_worker
from controlplane.core.calls.tool import ToolDefinition, ToolError, ToolInfo

if TYPE_CHECKING:
    from controlplane.core.calls.executor import CallRequest, CallScope


@dataclass(frozen=True)
class Prepared:
    resolved: tuple[ToolInfo, dict[str, Any]]
    text: str
    """The doom-loop fingerprint of the arguments as upstream's JSON.stringify writes them."""
    packed: arg_worker.Packed
    """The parsed arguments as the worker sent them, sent back as they are when validation needs them."""


class LargeArguments:
    def __init__(self, memory_mb: int = arg_worker.DEFAULT_MEMORY_MB) -> None:
        self._memory_mb = memory_mb
        self._worker: arg_worker.ArgWorker | None = None

    async def prepared(self, scope: CallScope, call: CallRequest) -> Prepared | None:
        tool = scope.tools.get(call.tool) or scope.tools.get(call.tool.lower())
        if tool is None:
            return None
        answer = await self.worker().run("prepare", call.args_json)
        if answer is None or answer[0] != "ok":
            return None
        _, packed, text = answer
        args = await asyncio.to_thread(arg_worker.unpack, packed)
        return Prepared((tool, args), text, packed)

    async def validated(
        self, tool_id: str, definition: ToolDefinition, args: dict[str, Any], prepared: Prepared | None,
    ) -> dict[str, Any] | None:
        """`validate`'s result from the worker; raises its ToolError as `validate` would."""
        model = definition.parameters
        ref = arg_worker.model_ref(model) if model is not None else ""
        if not ref or definition.format_validation_error is not None:
            return None
        if prepared is not None and args is prepared.resolved[1]:
            packed = prepared.packed  # no hook replaced them: what the worker sent, sent back unchanged
        else:
            packed = await asyncio.to_thread(arg_worker.pack, args)
        answer = await self.worker().run("validate", tool_id, ref, packed)
        if answer is None:
            return None
        if answer[0] == "tool error":
            raise ToolError(answer[1])
        checked: dict[str, Any] = await asyncio.to_thread(arg_worker.unpack, answer[1])
        return checked

    def worker(self) -> arg_worker.ArgWorker:
        if self._worker is None:
            self._worker = arg_worker.shared()
            self._worker.memory_mb = self._memory_mb  # the loop's one worker: the plane's executor sets it
        return self._worker

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.close()
