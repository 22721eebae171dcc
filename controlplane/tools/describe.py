"""Loading a tool's `.txt` description, with `${name}` placeholders filled in."""

from __future__ import annotations

import functools
import string
from importlib import resources


def description(tool_id: str, **values: object) -> str:
    return _described(tool_id, tuple(sorted((k, str(v)) for k, v in values.items())))


@functools.cache
def _described(tool_id: str, values: tuple[tuple[str, str], ...]) -> str:
    text = resources.files(__package__).joinpath(f"{tool_id}.txt").read_text(encoding="utf-8")
    if values:
        text = string.Template(text).safe_substitute(dict(values))
    return text.strip()
