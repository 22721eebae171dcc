"""Markdown agent files (`.opencode/agent/review.md`): YAML frontmatter for the agent's config, the body for
its prompt, read as upstream reads them.

gray-matter (js-yaml 3) parses upstream's frontmatter. PyYAML's safe loader reads the same YAML but for its
booleans: YAML 1.1's `yes`, `no`, `on` and `off` are strings to js-yaml, so they are here too. A file whose
frontmatter is not valid YAML gets the second reading upstream gives it (an unquoted value holding a colon
becomes text), shared with the skills' parser.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

from controlplane.errors import InvalidArgumentError
from sandbox_agent.custom.frontmatter import second_reading, split_matter

_BOOL_TAG = "tag:yaml.org,2002:bool"


class _JsYamlLoader(yaml.SafeLoader):
    """The safe loader with only `true`/`false` (any case pattern js-yaml accepts) as booleans."""


_JsYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JsYamlLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_agent(where: str, text: str) -> tuple[dict[str, Any], str]:
    """(config, prompt) of one markdown agent file; `where` names it in errors.

    The config is the frontmatter as JSON values (dates as JavaScript would print them, keys as strings);
    the prompt is the body without surrounding white space.
    """
    text = text.removeprefix("\ufeff")
    try:
        data, body = _read(text)
    except _NotYamlError as first:
        retried = second_reading(text)
        if retried == text:
            raise InvalidArgumentError(f"{where}: the frontmatter is not valid YAML: {first}") from None
        try:
            data, body = _read(retried)
        except _NotYamlError:
            raise InvalidArgumentError(f"{where}: the frontmatter is not valid YAML: {first}") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{where}: the frontmatter must be a mapping of agent settings")
    return _plain(data), body.strip()


class _NotYamlError(Exception):
    pass


def _read(text: str) -> tuple[Any, str]:
    parts = split_matter(text)
    if parts is None:
        return {}, text
    language, matter, body = parts
    try:
        if language == "json":
            data = json.loads(matter) if matter.strip() else {}
        elif language in ("", "yaml", "yml"):
            data = yaml.load(matter, Loader=_JsYamlLoader)
        else:
            raise _NotYamlError(f'frontmatter language "{language}" is not supported')
    except (yaml.YAMLError, ValueError) as exc:
        raise _NotYamlError(_one_line(exc)) from None
    return ({} if data is None else data), body


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _plain(value: Any) -> Any:
    """A YAML value as the JSON value JavaScript would hold for it."""
    if isinstance(value, Mapping):
        return {_key(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo is None else value.astimezone(datetime.UTC).replace(tzinfo=None)
        return moment.isoformat(timespec="milliseconds") + "Z"
    if isinstance(value, datetime.date):
        return f"{value.isoformat()}T00:00:00.000Z"
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON.stringify's NaN and Infinity
    if isinstance(value, (set, frozenset)):
        return {_key(key): None for key in value}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _key(key: Any) -> str:
    """An object key as JavaScript spells a non-string one."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    return str(_plain(key))
