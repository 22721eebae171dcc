"""Markdown agent files (`.opencode/agent/review.md`): YAML frontmatter for the agent's config, the body for
its prompt, read as upstream reads them.

gray-matter (js-yaml 3) parses upstream's frontmatter. PyYAML's safe loader reads the same YAML but for its
booleans: YAML 1.1's `yes`, `no`, `on` and `off` are strings to js-yaml, so they are here too. A file whose
frontmatter is not valid YAML gets the second reading upstream gives it (an unquoted value holding a colon
becomes text), shared with the skills' parser in the sandbox (`opencode_semantics.frontmatter`).
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

from controlplane.core.config.config_text import MAX_DEPTH
from controlplane.errors import ControlPlaneError, InvalidArgumentError
from opencode_semantics.frontmatter import second_reading, split_matter
from opencode_semantics.javascript import js_number

_BOOL_TAG = "tag:yaml.org,2002:bool"
_VALUE_TAG = "tag:yaml.org,2002:value"  # YAML 1.1's `=`, a plain string to js-yaml


class _JsYamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader (libyaml's parser where PyYAML has it) with only `true`/`false` (in the case patterns
    js-yaml accepts) as booleans."""


_JsYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_BOOL_TAG, _VALUE_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_JsYamlLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class ExpansionBudget:
    """What the frontmatters of one project may expand to (a value costs 1, a string its length too): aliases
    make a few lines stand for an exponential tree, which is refused rather than built."""

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def spend(self, cost: int) -> None:
        self.left -= cost
        if self.left < 0:
            raise InvalidArgumentError(
                f"the frontmatter expands past {self.limit} characters and values (YAML aliases?)"
            )


def parse_agent(text: str, budget: ExpansionBudget) -> tuple[dict[str, Any], str]:
    """(config, prompt) of one markdown agent file, as upstream reads it.

    The config is the frontmatter as JSON values (dates stay JsDate strings, keys are strings); the prompt
    is the body without surrounding white space. A frontmatter that is not a mapping is spread into an
    object as JavaScript spreads it (a list by index, a string by character). When the frontmatter is not
    YAML even on its second reading, upstream keeps the file as an agent whose prompt is the whole text.
    """
    text = text.removeprefix("\ufeff")
    try:
        data, body = _read(text)
    except _NotYamlError:
        retried = second_reading(text)
        if retried == text:
            return {}, text.strip()
        try:
            data, body = _read(retried)
        except _NotYamlError:
            return {}, text.strip()
    return _spread(_plain(data, budget)), body.strip()


class JsDate(str):
    """A YAML timestamp, kept as the text JSON would give the JavaScript Date: not a string to a schema."""

    __slots__ = ()


class _NotYamlError(ControlPlaneError):
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
            # The line break before the closing `---` ends the last line (a `|` block keeps it).
            _check_depth(matter + "\n")
            data = yaml.load(matter + "\n", Loader=_JsYamlLoader)
        else:
            raise _NotYamlError(f'frontmatter language "{language}" is not supported')
    except InvalidArgumentError:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise _NotYamlError(str(exc)) from None
    return ({} if data is None else data), body


def _spread(value: Any) -> dict[str, Any]:
    """`{...value}` in JavaScript."""
    if isinstance(value, dict):
        return value
    if isinstance(value, (list, str)):
        return {str(index): item for index, item in enumerate(value)}
    return {}


def _check_depth(matter: str) -> None:
    """Refuses nesting past MAX_DEPTH from the parser's events, before libyaml's recursive composer (whose
    C stack a few thousand `[` would overflow) builds anything."""
    depth = 0
    for event in yaml.parse(matter, Loader=_JsYamlLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise InvalidArgumentError(f"the frontmatter nests deeper than {MAX_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _plain(value: Any, budget: ExpansionBudget, depth: int = 0) -> Any:
    """A YAML value as the JSON value JavaScript would hold for it, within `budget` (aliases expanded)."""
    budget.spend(1 + (len(value) if isinstance(value, (str, bytes)) else 0))
    if depth > MAX_DEPTH:
        raise InvalidArgumentError(f"the frontmatter nests deeper than {MAX_DEPTH} levels (YAML aliases?)")
    if isinstance(value, Mapping):
        return {js_key(key): _plain(item, budget, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, budget, depth + 1) for item in value]
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo is None else value.astimezone(datetime.UTC).replace(tzinfo=None)
        return JsDate(moment.isoformat(timespec="milliseconds") + "Z")
    if isinstance(value, datetime.date):
        return JsDate(f"{value.isoformat()}T00:00:00.000Z")
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON.stringify's NaN and Infinity
    if isinstance(value, (set, frozenset)):
        return {js_key(key): None for key in value}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def js_key(key: Any) -> str:
    """An object key as JavaScript spells a non-string one."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, (int, float)):
        return js_number(key)
    return str(key)
