"""The API of Python custom tools, the counterpart of `tool()` from @opencode-ai/plugin.

    from opencode_tool import tool
    hello = tool(description="Say hello", args=HelloArgs, execute=say_hello)   # or @tool(...) on a function
See docs/custom-tools-python.md.

The Python tool host is a process of its own; its exception tree (tests/unit/test_error_tree.py checks it):

ToolHostError
├── PermissionDenied    `ctx.ask` was refused
└── InvalidArguments    the arguments do not satisfy the tool's schema
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, overload

import opencode_json_args as json_args

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "contains")

Execute = Callable[[Any, "ToolContext"], Any]


class ToolHostError(Exception):
    """Root of every error the Python tool host raises on purpose."""


class PermissionDenied(ToolHostError):  # noqa: N818 - named for what tool authors catch
    """Raised by `ctx.ask` when the permission was refused; `str(exc)` is the refusal's text."""


class InvalidArguments(ToolHostError):  # noqa: N818
    """The arguments do not satisfy the tool's schema; `str(exc)` is the validator's own message."""


def _is_model(args: object) -> bool:
    # Duck-typed so that the host does not pay for importing pydantic when no tool uses it.
    return isinstance(args, type) and callable(getattr(args, "model_validate", None)) and callable(
        getattr(args, "model_json_schema", None)
    )


def _without_titles(schema: Any) -> Any:
    """pydantic's schema minus its generated `title` annotations (a property named "title" stays)."""
    if not isinstance(schema, dict):
        return schema
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":
            continue
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            result[key] = {name: _without_titles(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            result[key] = [_without_titles(sub) for sub in value]
        elif key in _SUBSCHEMA_ONE:
            result[key] = _without_titles(value)
        else:
            result[key] = value
    return result


@dataclass(frozen=True)
class Tool:
    """A tool definition; bind it to a module-level name for the host to find it."""

    description: str
    args: Any
    """A pydantic model class, or a JSON Schema (a dict with "type": "object")."""
    execute: Execute

    def __post_init__(self) -> None:
        if not isinstance(self.description, str):
            raise TypeError("description must be a string")
        if not callable(self.execute):
            raise TypeError("execute must be a function")
        if not _is_model(self.args):
            json_args.check_parameters(self.args)

    def parameters(self) -> dict[str, Any]:
        """The JSON Schema the model sees."""
        schema = _without_titles(self.args.model_json_schema()) if _is_model(self.args) else dict(self.args)
        schema.pop("$schema", None)
        return {"$schema": SCHEMA_DIALECT, **schema}

    def unenforced(self) -> list[str]:
        """JSON Schema keywords the host does not check (none for a pydantic model)."""
        return [] if _is_model(self.args) else json_args.unenforced_keywords(self.args)

    def parse(self, raw: Any) -> Any:
        """A model instance (pydantic args) or a dict with defaults applied and undeclared keys kept."""
        if _is_model(self.args):
            import pydantic  # already imported by the tool that defined the model

            try:
                return self.args.model_validate(raw)
            except pydantic.ValidationError as exc:
                raise InvalidArguments(str(exc)) from None
        value, issues = json_args.parse(self.args, raw)
        if issues:
            raise InvalidArguments(json_args.format_issues(issues))
        return value


@overload
def tool(*, description: str, args: Any, execute: Execute) -> Tool: ...


@overload
def tool(*, description: str, args: Any) -> Callable[[Execute], Tool]: ...


def tool(*, description: str, args: Any, execute: Execute | None = None) -> Tool | Callable[[Execute], Tool]:
    """Defines a tool; without `execute` it is a decorator for the execute function."""
    if execute is not None:
        return Tool(description, args, execute)

    def decorate(function: Execute) -> Tool:
        return Tool(description, args, function)

    return decorate


MetadataSink = Callable[[str | None, dict[str, Any] | None], None]
Asker = Callable[[str, list[str], list[str], dict[str, Any]], Awaitable[None]]


@dataclass
class ToolContext:
    """What `execute(args, ctx)` receives; the camelCase names of the JS API are aliases."""

    session_id: str
    message_id: str
    agent: str
    call_id: str
    directory: str
    worktree: str
    extra: dict[str, Any]
    abort: asyncio.Event
    """Set when the call is aborted: check `ctx.abort.is_set()` (any thread) or `await ctx.abort.wait()`."""
    _send_metadata: MetadataSink = field(repr=False)
    _ask: Asker = field(repr=False)
    _loop: asyncio.AbstractEventLoop = field(repr=False)

    @property
    def sessionID(self) -> str:  # noqa: N802
        return self.session_id

    @property
    def messageID(self) -> str:  # noqa: N802
        return self.message_id

    @property
    def callID(self) -> str:  # noqa: N802
        return self.call_id

    async def metadata(self, title: str | None = None, metadata: dict[str, Any] | None = None) -> None:
        """Streams a live title and/or metadata update of the running call."""
        self._send_metadata(title, metadata)

    async def ask(self, *, permission: str, patterns: list[str], always: list[str] | None = None,
                  metadata: dict[str, Any] | None = None) -> None:
        """Returns when allowed; raises PermissionDenied with the refusal's text otherwise."""
        await self._ask(permission, list(patterns), list(always or []), dict(metadata or {}))

    def metadata_sync(self, title: str | None = None, metadata: dict[str, Any] | None = None) -> None:
        """`metadata` for a synchronous execute (which runs in a worker thread)."""
        self._loop.call_soon_threadsafe(self._send_metadata, title, metadata)

    def ask_sync(self, *, permission: str, patterns: list[str], always: list[str] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        """`ask` for a synchronous execute: blocks its worker thread until the answer."""
        coroutine = self.ask(permission=permission, patterns=patterns, always=always, metadata=metadata)
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()
