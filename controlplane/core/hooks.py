"""The hook bus: named hooks run in registration order around every tool call.

`trigger(name, input, output)` awaits each hook with the same `output` dict and returns it, so a
hook may change it in place or return a replacement dict (which the caller then uses).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Hook = Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any] | None]]


class HookBus:
    def __init__(self) -> None:
        self._hooks: dict[str, list[Hook]] = {}

    def add(self, name: str, hook: Hook) -> None:
        self._hooks.setdefault(name, []).append(hook)

    def has(self, name: str) -> bool:
        return bool(self._hooks.get(name))

    async def trigger(self, name: str, input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        for hook in self._hooks.get(name, ()):
            replaced = await hook(input_, output)
            if replaced is not None:
                output = replaced
        return output
