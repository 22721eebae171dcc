"""Loading a tool's `.txt` description, with `${name}` placeholders filled in."""

from __future__ import annotations

import contextvars
import functools
import string
from importlib import resources

OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar("description_override", default=None)
"""The operator's text for the tool being initialised (tools/description_overrides.py sets it around init), so
that the placeholders a tool fills (`${agents}`, `${skills}`, ...) are filled in it too."""


def description(tool_id: str, **values: object) -> str:
    override = OVERRIDE.get()
    if override is not None:
        return _filled(override, tuple(sorted((k, str(v)) for k, v in values.items())))
    return _described(tool_id, tuple(sorted((k, str(v)) for k, v in values.items())))


def _filled(text: str, values: tuple[tuple[str, str], ...]) -> str:
    if values:
        text = string.Template(text).safe_substitute(dict(values))
    return text.strip()


@functools.cache
def _described(tool_id: str, values: tuple[tuple[str, str], ...]) -> str:
    text = resources.files(__package__).joinpath(f"{tool_id}.txt").read_text(encoding="utf-8")
    if values:
        text = string.Template(text).safe_substitute(dict(values))
    return text.strip()
