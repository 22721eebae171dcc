"""The hook bus: operator plugins' hooks, by OpenCode's hook names, run in load order.

`trigger(name, input, output)` awaits each hook with the same `output` dict; a hook may change it
in place or return a replacement dict, which the next hook and the caller then use (for
`tool.execute.before` that is an intentional fix: upstream drops a replaced `args`). Each hook has
a time limit. A failing hook raises HookError carrying the hook's own message, as upstream lets the
exception through unchanged (the call fails with that text; the plugin is named in the log and the
span), unless the trigger is `tolerant` (after-hooks, events): then it is logged and the output so
far is kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from controlplane.core.calls.tool import ToolError
from controlplane.telemetry import attributes, spans

log = logging.getLogger(__name__)

Hook = Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any] | None]]
HOOK_NAMES = frozenset({
    "tool.execute.before", "tool.execute.after", "tool.definition", "shell.env", "event", "permission.ask",
})
DEFAULT_TIMEOUT_S = 10.0


class HookError(ToolError):
    """A plugin hook failed or timed out; the message names the hook and the plugin."""


@dataclass(frozen=True)
class _Registered:
    hook: Hook
    origin: str


class HookBus:
    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._hooks: dict[str, list[_Registered]] = {}
        self.timeout_s = timeout_s

    def add(self, name: str, hook: Hook, origin: str = "") -> None:
        self._hooks.setdefault(name, []).append(_Registered(hook, origin or getattr(hook, "__module__", "")))

    def has(self, name: str) -> bool:
        return bool(self._hooks.get(name))

    async def trigger(
        self, name: str, input_: dict[str, Any], output: dict[str, Any], *, tolerant: bool = False,
    ) -> dict[str, Any]:
        for registered in self._hooks.get(name, ()):
            try:
                replaced = await spans.traced(
                    f"{attributes.SPAN_HOOK} {name}",
                    {attributes.HOOK_NAME: name, attributes.HOOK_PLUGIN: registered.origin},
                    asyncio.wait_for(registered.hook(input_, output), self.timeout_s),
                )
            except Exception as exc:
                error = _describe(name, registered.origin, exc, self.timeout_s)
                if not tolerant:
                    log.info("%s", error)
                    raise HookError(_model_text(exc, error)) from exc
                log.warning("%s", error)
                continue
            if isinstance(replaced, dict):
                output = replaced
        return output


def _describe(name: str, origin: str, exc: Exception, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"Plugin hook {name} timed out after {timeout_s:g} s ({origin})"
    return f"Plugin hook {name} failed ({origin}): {exc}"


def _model_text(exc: Exception, described: str) -> str:
    """What the failed call reports: the hook's own message (a timeout, which upstream cannot have, is
    described)."""
    if isinstance(exc, TimeoutError):
        return described
    return str(exc) or type(exc).__name__
