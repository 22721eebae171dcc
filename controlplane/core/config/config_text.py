"""The text of a project config file: JSONC documents and upstream's `{env:}`/`{file:}` substitutions, read
under limits, since a tenant's archive is the input.

Every limit fails with InvalidArgumentError naming the file; nothing here can make the control plane
work or allocate without bound.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections.abc import Mapping
from typing import Any

import pyjson5

from controlplane.errors import InvalidArgumentError

MAX_FILE_BYTES = 1 << 20
"""A project config file, agent file or `{file:}` target larger than this is refused, not read."""
MAX_CONFIG_CHARS = 4 << 20
"""The most text a session's config may come to: after substitutions, after aliases, after merging."""
MAX_DEPTH = 200
"""The deepest nesting of objects and lists a config file may have."""
SHOWN_CHARS = 120

_ENV_REFERENCE = re.compile(r"\{env:[^}]+\}")
_FILE_REFERENCE = re.compile(r"\{file:(?P<path>[^}]+)\}")


def shown(value: Any) -> str:
    """A value as JSON, cut short for an error message."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    if not is_utf8(text):  # an unpaired surrogate: a status message must be UTF-8
        text = json.dumps(value, default=str)
    return cut(text)


def is_utf8(text: str) -> bool:
    """False for text holding an unpaired surrogate, which neither the store nor gRPC can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def cut(text: str) -> str:
    """Text cut short for an error message: a status message must stay small."""
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def decoded(path: str, data: bytes) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise InvalidArgumentError(
            f"workspace {cut(path)} is {len(data)} bytes; a project config file may have at most {MAX_FILE_BYTES}"
        )
    return data.decode("utf-8", "replace")


def document(where: str, text: str) -> dict[str, Any]:
    """A JSONC object (comments, trailing commas), its numbers finite and its nesting bounded."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = pyjson5.loads(text)
        except (pyjson5.Json5Exception, ValueError) as exc:
            reason = exc.args[0] if exc.args else exc
            raise InvalidArgumentError(f"{where} is not valid JSON: {cut(str(reason))}") from None
        except RecursionError:
            raise InvalidArgumentError(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except RecursionError:
        raise InvalidArgumentError(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where} must be a JSON object (an opencode.json document)")
    check_values(where, value)
    return value


def check_values(where: str, value: Any) -> None:
    """Refuses nesting past MAX_DEPTH and numbers JSON cannot carry (NaN, Infinity, 1e999)."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise InvalidArgumentError(f"{where} nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            pending += [(child, depth + 1) for child in item.values()]
        elif isinstance(item, list):
            pending += [(child, depth + 1) for child in item]
        elif isinstance(item, float) and not math.isfinite(item):
            raise InvalidArgumentError(f"{where} has a number JSON cannot hold ({item})")


def file_references(path: str, text: str) -> set[str]:
    """Workspace paths that `{file:...}` names in the config file `path` (outside the workspace: left out)."""
    found: set[str] = set()
    for line in _active_lines(_without_env(text)):
        for reference in _FILE_REFERENCE.finditer(line, 0, line.rfind("}") + 1):
            target = _reference_path(path, reference["path"])
            if target is not None:
                found.add(target)
    return found


def substituted(where: str, path: str, text: str, files: Mapping[str, bytes]) -> str:
    """`{env:NAME}` and `{file:path}` replaced as upstream replaces them in a config file's text.

    A session has no environment of its own and the control plane's is not the tenant's, so every
    variable reads as unset: upstream's empty string. A file is read from the archive, relative to the
    config file; one outside the workspace or not in the archive fails as upstream's missing file does.
    References on a line that is only a `//` comment are skipped, as upstream skips them.
    """
    budget = [MAX_CONFIG_CHARS - len(text)]

    def content(match: re.Match[str]) -> str:
        target = _reference_path(path, match["path"])
        data = files.get(target) if target is not None else None
        if data is None:
            where_to = f"{cut(target)} is not in the workspace archive" if target else "it is outside the workspace"
            raise InvalidArgumentError(f"{where}: bad file reference: {shown(match[0])}: {where_to}")
        inserted = json.dumps(decoded(target or "", data).strip(), ensure_ascii=False)[1:-1]
        budget[0] -= len(inserted)
        if budget[0] < 0:
            raise InvalidArgumentError(f"{where}: its {{file:}} references come to more than {MAX_CONFIG_CHARS} "
                                       "characters")
        return inserted

    lines = _without_env(text).split("\n")
    return "\n".join(
        line if _is_comment(line) else _sub_before_last_brace(_FILE_REFERENCE, content, line) for line in lines
    )


def _without_env(text: str) -> str:
    return _sub_before_last_brace(_ENV_REFERENCE, "", text)


def _sub_before_last_brace(pattern: re.Pattern[str], replacement: Any, text: str) -> str:
    # No reference ends past the last `}`: searching only up to it keeps a text of unclosed `{env:` linear.
    cut = text.rfind("}") + 1
    return pattern.sub(replacement, text[:cut]) + text[cut:]


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("//")


def _active_lines(text: str) -> list[str]:
    return [line for line in text.split("\n") if not _is_comment(line)]


def _reference_path(config_path: str, reference: str) -> str | None:
    """The workspace path a `{file:...}` of `config_path` names, or None outside the workspace."""
    if reference.startswith(("/", "~")):
        return None
    return within_workspace(posixpath.join(posixpath.dirname(config_path), reference))


def within_workspace(path: str) -> str | None:
    normal = posixpath.normpath(path)
    return None if normal.startswith("../") or normal in ("..", ".") else normal
