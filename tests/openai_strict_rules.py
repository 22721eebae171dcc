"""A checker of OpenAI's published strict-mode (Structured Outputs) rules for function parameters, written from
the rules as documented, independently of controlplane.formats, so that the conversion is checked against
the rules and not against itself.

The rules: the root is an object (not an anyOf); every object lists all its properties in `required` and sets
`additionalProperties: false`; every schema has a `type` (string, number, integer, boolean, object, array,
null, or a list of them) or is an `anyOf` of such schemas; only the supported keywords appear (generic:
type, description, properties, required, additionalProperties, items, enum, const, anyOf, $defs, $ref;
strings: pattern, format; numbers: multipleOf, minimum, maximum, exclusiveMinimum, exclusiveMaximum; arrays:
minItems, maxItems); `items` is one schema; an enum of a nullable type includes null; at most 10 levels of
nesting, 5000 properties, 1000 enum values, and 120,000 characters of property names, enum values and consts.
"""

from __future__ import annotations

import re
from typing import Any

GENERIC = {"type", "description", "properties", "required", "additionalProperties", "items", "enum", "const",
           "anyOf", "$defs", "$ref"}
BY_TYPE = {"string": {"pattern", "format"},
           "number": {"multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
           "integer": {"multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
           "array": {"minItems", "maxItems"}}
TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_DEPTH, MAX_PROPERTIES, MAX_ENUM_VALUES, MAX_STRING_CHARS = 10, 5000, 1000, 120_000


class Tally:
    def __init__(self) -> None:
        self.properties = 0
        self.enum_values = 0
        self.chars = 0


def strict_violations(entry: dict[str, Any]) -> list[str]:
    """Every rule a Chat Completions tool entry breaks (empty when it is a valid strict function)."""
    problems: list[str] = []
    if entry.get("type") != "function" or set(entry) != {"type", "function"}:
        problems.append("entry: not {type: function, function: {...}}")
    function = entry.get("function", {})
    if function.get("strict") is not True:
        problems.append("function.strict is not true")
    if not NAME.match(str(function.get("name", ""))):
        problems.append(f"function.name {function.get('name')!r} breaks ^[A-Za-z0-9_-]{{1,64}}$")
    root = function.get("parameters")
    if not isinstance(root, dict):
        return [*problems, "parameters: not a schema"]
    if root.get("type") != "object" or "anyOf" in root:
        problems.append("parameters: the root must be an object schema, not an anyOf")
    tally = Tally()
    _check(root, "parameters", 1, tally, problems)
    if tally.properties > MAX_PROPERTIES:
        problems.append(f"{tally.properties} properties (at most {MAX_PROPERTIES})")
    if tally.enum_values > MAX_ENUM_VALUES:
        problems.append(f"{tally.enum_values} enum values (at most {MAX_ENUM_VALUES})")
    if tally.chars > MAX_STRING_CHARS:
        problems.append(f"{tally.chars} characters of names and values (at most {MAX_STRING_CHARS})")
    return problems


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    return set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()


def _check(node: Any, where: str, depth: int, tally: Tally, problems: list[str]) -> None:
    if not isinstance(node, dict):
        problems.append(f"{where}: not a schema object")
        return
    if depth > MAX_DEPTH:
        problems.append(f"{where}: nested deeper than {MAX_DEPTH} levels")
    types = _types(node)
    if "anyOf" in node:
        if not isinstance(node["anyOf"], list) or not node["anyOf"]:
            problems.append(f"{where}.anyOf: not a non-empty list")
        else:
            for i, option in enumerate(node["anyOf"]):
                _check(option, f"{where}.anyOf[{i}]", depth, tally, problems)
    elif "$ref" not in node:
        if not types:
            problems.append(f"{where}: no type")
        elif not types <= TYPES:
            problems.append(f"{where}: unsupported type {sorted(types - TYPES)}")
    allowed = set(GENERIC)
    for kind in types:
        allowed |= BY_TYPE.get(kind, set())
    for key in node:
        if key not in allowed:
            problems.append(f"{where}: keyword {key!r} is not supported in strict mode")
    if node.get("format") is not None and node["format"] not in FORMATS:
        problems.append(f"{where}: format {node['format']!r} is not supported")
    if "enum" in node:
        values = node["enum"]
        tally.enum_values += len(values)
        tally.chars += sum(len(str(v)) for v in values if v is not None)
        if "null" in types and None not in values:
            problems.append(f"{where}: a nullable enum must list null")
    if "const" in node:
        tally.chars += len(str(node["const"]))
    if "object" in types or "properties" in node:
        properties = node.get("properties")
        if not isinstance(properties, dict):
            problems.append(f"{where}: an object without properties")
            properties = {}
        if node.get("additionalProperties") is not False:
            problems.append(f"{where}: additionalProperties is not false")
        required = node.get("required", [])
        missing = [name for name in properties if name not in required]
        if missing:
            problems.append(f"{where}: properties missing from required: {missing}")
        extra = [name for name in required if name not in properties]
        if extra:
            problems.append(f"{where}: required names unknown properties: {extra}")
        tally.properties += len(properties)
        for name, sub in properties.items():
            tally.chars += len(name)
            _check(sub, f"{where}.{name}", depth + 1, tally, problems)
    if "array" in types:
        if not isinstance(node.get("items"), dict):
            problems.append(f"{where}: an array's items must be one schema")
        else:
            _check(node["items"], f"{where}[]", depth + 1, tally, problems)
    for name, sub in (node.get("$defs") or {}).items():
        _check(sub, f"{where}.$defs.{name}", depth + 1, tally, problems)
