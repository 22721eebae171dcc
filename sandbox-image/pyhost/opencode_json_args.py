"""JSON Schema `args` of Python tools: the subset the host enforces, reported as zod-style issues.

Enforced: type, properties, required, additionalProperties, enum, const, items; `default` fills
missing properties. Other keywords are listed by `unenforced_keywords` so the host can say so.
"""

from __future__ import annotations

import copy
import json
from typing import Any

KNOWN = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "default",
    "description", "title", "examples", "$schema",
}
_CHECKED_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}

Issue = dict[str, Any]
Path = list[str | int]


def check_parameters(schema: object) -> dict[str, Any]:
    """The schema as the tool's parameters; TypeError when it does not describe an object."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise TypeError('args must be a pydantic model class or a JSON Schema with "type": "object"')
    for name, sub in (schema.get("properties") or {}).items():
        if not isinstance(sub, dict):
            raise TypeError(f"the schema of property {name!r} must be an object")
    return schema


def unenforced_keywords(schema: dict[str, Any], where: str = "") -> list[str]:
    """`keyword at /json/pointer` for every keyword the validator does not check."""
    found = [f"{key} at {where or '/'}" for key in schema if key not in KNOWN]
    for name, sub in (schema.get("properties") or {}).items():
        if isinstance(sub, dict):
            found += unenforced_keywords(sub, f"{where}/properties/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += unenforced_keywords(schema[key], f"{where}/{key}")
    return found


def parse(schema: dict[str, Any], value: object) -> tuple[Any, list[Issue]]:
    """The value with defaults applied, and the issues found (none when it is valid)."""
    issues: list[Issue] = []
    return _check(schema, value, [], issues), issues


def format_issues(issues: list[Issue]) -> str:
    return json.dumps(issues, indent=2, ensure_ascii=False)


def _check(schema: dict[str, Any], value: Any, path: Path, issues: list[Issue]) -> Any:
    if "const" in schema and not _same(value, schema["const"]):
        issues.append({"code": "invalid_value", "values": [schema["const"]], "path": path,
                       "message": f"Invalid input: expected {_js(schema['const'])}"})
        return value
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        options = "|".join(_js(option) for option in schema["enum"])
        issues.append({"code": "invalid_value", "values": list(schema["enum"]), "path": path,
                       "message": f"Invalid option: expected one of {options}"})
        return value
    expected = schema.get("type")
    if expected is not None:
        allowed = expected if isinstance(expected, list) else [expected]
        if not any(_is_type(value, name) for name in allowed if name in _CHECKED_TYPES):
            issues.append(_invalid_type("|".join(allowed), _received(value), path))
            return value
    if isinstance(value, dict):
        return _check_object(schema, value, path, issues)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_check(schema["items"], item, [*path, index], issues) for index, item in enumerate(value)]
    return value


def _check_object(schema: dict[str, Any], value: dict[str, Any], path: Path, issues: list[Issue]) -> dict[str, Any]:
    properties: dict[str, dict[str, Any]] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    result = dict(value)
    for name, sub in properties.items():
        if name in value:
            result[name] = _check(sub, value[name], [*path, name], issues)
        elif "default" in sub:
            result[name] = copy.deepcopy(sub["default"])
        elif name in required:
            issues.append(_invalid_type(_type_name(sub), "undefined", [*path, name]))
    for name in sorted(required - properties.keys() - value.keys()):
        issues.append(_invalid_type("value", "undefined", [*path, name]))
    extra = [key for key in value if key not in properties]
    more = schema.get("additionalProperties", True)
    if more is False and extra:
        keys = ", ".join(_js(key) for key in extra)
        noun = "key" if len(extra) == 1 else "keys"
        issues.append({"code": "unrecognized_keys", "keys": extra, "path": path,
                       "message": f"Unrecognized {noun}: {keys}"})
    elif isinstance(more, dict):
        for key in extra:
            result[key] = _check(more, value[key], [*path, key], issues)
    return result


def _invalid_type(expected: str, received: str, path: Path) -> Issue:
    return {"expected": expected, "code": "invalid_type", "path": path,
            "message": f"Invalid input: expected {expected}, received {received}"}


def _type_name(schema: dict[str, Any]) -> str:
    expected = schema.get("type")
    if isinstance(expected, list):
        return "|".join(expected)
    return str(expected) if expected is not None else "value"


def _is_type(value: Any, name: str) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return name == "number" or isinstance(value, int) or value.is_integer()


def _received(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _same(a: Any, b: Any) -> bool:
    # In Python True == 1; in JSON they are different values.
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)


def _js(value: Any) -> str:
    """What JSON.stringify gives, as zod quotes values in its messages."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
