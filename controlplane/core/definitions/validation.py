"""Validating tool arguments the way zod 4.1.8 parses them, with zod's error text.

`validate` walks the zod equivalent of the parameters model (see `schema.py`): checks run in zod's
order, issues carry zod's keys in zod's order, and the message embeds `String(zodError)` (the
issues as 2-space-indented JSON, numbers in JavaScript's notation: `opencode_semantics.javascript`,
which also gives `z.coerce`'s `Number()`). Unlike `z.object`, undeclared
keys are kept in the result (a platform decision; see `tool.py`).
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from controlplane.core.calls.tool import ToolError
from controlplane.core.definitions.schema import (
    MISSING,
    AnyNode,
    ArrayNode,
    BooleanNode,
    Bound,
    Node,
    NullableNode,
    NumberNode,
    ObjectNode,
    RecordNode,
    StringNode,
    UnionNode,
    ValuesNode,
    object_node,
)
from opencode_semantics.javascript import (
    MAX_SAFE_INTEGER,
    is_number,
    js_keys,
    js_number,
    js_parsed,
    js_string,
    js_to_number,
    json_stringify,
)

FormatError = Callable[[ValidationError], str]


def validate(
    tool_id: str, model: type[BaseModel], args: Any, format_error: FormatError | None = None
) -> dict[str, Any]:
    """`args` parsed by `model`'s zod equivalent, as a new dict; raises ToolError on invalid input.

    With `format_error` (a tool's `format_validation_error`), its text replaces the generic message;
    it receives a pydantic ValidationError whose errors are zod's issues (type = zod code).
    """
    node = object_node(model)
    value, issues = _run(node, js_parsed(args))
    if not issues:
        assert isinstance(value, dict)
        return value
    if format_error is not None:
        raise ToolError(format_error(_validation_error(model, args, issues)))
    raise ToolError(
        f"The {tool_id} tool was called with invalid arguments: {zod_error_string(issues)}.\n"
        "Please rewrite the input so it satisfies the expected schema."
    )


@dataclass
class Issue:
    """One zod issue: `body` holds its code-specific keys in zod's order; `path` and `message` follow."""

    body: dict[str, Any]
    message: str
    path: list[str | int] = field(default_factory=list)
    can_continue: bool = False
    """zod's `continue`: a check may still run after this issue (only bound and length checks set it)."""

    def final(self) -> dict[str, Any]:
        return {**self.body, "path": list(self.path), "message": self.message}


def zod_error_string(issues: list[Issue]) -> str:
    """`String(zodError)`: `JSON.stringify(issues, null, 2)`."""
    return json_stringify([i.final() for i in issues], indent=2)


def _validation_error(model: type[BaseModel], args: Any, issues: list[Issue]) -> ValidationError:
    details: list[InitErrorDetails] = []
    for issue in issues:
        # Without a context pydantic uses the template verbatim, so braces in a message stay as they are.
        details.append(
            InitErrorDetails(
                type=PydanticCustomError(str(issue.body.get("code", "custom")), issue.message),
                loc=tuple(issue.path),
                input=_value_at(args, issue.path),
            )
        )
    return ValidationError.from_exception_data(model.__name__, details)


def _value_at(value: Any, path: list[str | int]) -> Any:
    for seg in path:
        try:
            value = value[seg]
        except (KeyError, IndexError, TypeError):
            return None
    return value


# ---------------------------------------------------------------------------------------------
# parsing


Result = tuple[Any, list[Issue]]


def _run(node: Node, value: Any) -> Result:
    match node:
        case StringNode():
            return _run_string(node, value)
        case NumberNode():
            return _run_number(node, value)
        case BooleanNode():
            if isinstance(value, bool):
                return value, []
            return value, [_invalid_type("boolean", value)]
        case ValuesNode():
            return _run_values(node, value)
        case ArrayNode():
            return _run_array(node, value)
        case RecordNode():
            return _run_record(node, value)
        case UnionNode():
            return _run_union(node, value)
        case NullableNode():
            return (None, []) if value is None else _run(node.inner, value)
        case AnyNode():
            return value, []
        case ObjectNode():
            return _run_object(node, value)
    raise AssertionError(node)


def _run_object(node: ObjectNode, value: Any) -> Result:
    if not isinstance(value, dict):
        return value, [_invalid_type("object", value)]
    out: dict[str, Any] = {}
    issues: list[Issue] = []
    for spec in node.fields:
        raw = value.get(spec.key, MISSING)
        if raw is MISSING and spec.optional:
            continue
        if raw is MISSING and spec.default is not MISSING:
            out[spec.key] = copy.deepcopy(spec.default)
            continue
        parsed, found = _run(spec.node, raw)
        issues += _prefixed(spec.key, found)
        if parsed is not MISSING:
            out[spec.key] = parsed
    declared = {spec.key for spec in node.fields}
    unknown = [k for k in js_keys(value) if k not in declared]
    if unknown and node.extra == "strict":
        issues.append(
            Issue(
                {"code": "unrecognized_keys", "keys": unknown},
                f"Unrecognized key{'s' if len(unknown) > 1 else ''}: " + ", ".join(_primitive(k) for k in unknown),
            )
        )
    for key in unknown:
        out[key] = value[key]
    return out, issues


def _run_array(node: ArrayNode, value: Any) -> Result:
    issues: list[Issue] = []
    if not isinstance(value, list):
        issues.append(_invalid_type("array", value))
    else:
        items = []
        for index, item in enumerate(value):
            parsed, found = _run(node.item, item)
            issues += _prefixed(index, found)
            items.append(parsed)
        value = items
    # zod's length checks run whenever the value has a length, even after a failed type check.
    return value, issues + _length_checks(value, node.min_items, node.max_items)


def _run_record(node: RecordNode, value: Any) -> Result:
    if not isinstance(value, dict):
        return value, [_invalid_type("record", value)]
    out: dict[str, Any] = {}
    issues: list[Issue] = []
    for key in js_keys(value):
        parsed, found = _run(node.value, value[key])
        issues += _prefixed(key, found)
        out[key] = parsed
    return out, issues


def _run_union(node: UnionNode, value: Any) -> Result:
    results = [_run(option, value) for option in node.options]
    for result in results:
        if not result[1]:
            return result
    continuing = [r for r in results if all(i.can_continue for i in r[1])]
    if len(continuing) == 1:
        return continuing[0]
    errors = [[i.final() for i in found] for _, found in results]
    return value, [Issue({"code": "invalid_union", "errors": errors}, "Invalid input")]


def _run_string(node: StringNode, value: Any) -> Result:
    issues = [] if isinstance(value, str) else [_invalid_type("string", value)]
    return value, issues + _length_checks(value, node.min_length, node.max_length)


def _length_checks(value: Any, minimum: int | None, maximum: int | None) -> list[Issue]:
    if isinstance(value, str):
        origin, unit, length = "string", "characters", len(value.encode("utf-16-le")) // 2
    elif isinstance(value, list):
        origin, unit, length = "array", "items", len(value)
    else:
        return []
    issues = []
    if minimum is not None and length < minimum:
        body = {"origin": origin, "code": "too_small", "minimum": minimum, "inclusive": True}
        issues.append(Issue(body, f"Too small: expected {origin} to have >={minimum} {unit}", can_continue=True))
    if maximum is not None and length > maximum:
        body = {"origin": origin, "code": "too_big", "maximum": maximum, "inclusive": True}
        issues.append(Issue(body, f"Too big: expected {origin} to have <={maximum} {unit}", can_continue=True))
    return issues


def _run_number(node: NumberNode, value: Any) -> Result:
    if node.coerce:
        value = js_to_number(value)
    if not is_number(value) or not math.isfinite(value):
        issue = _invalid_type("number", value)
        if is_number(value):
            issue.body["received"] = "NaN" if math.isnan(value) else "Infinity"
        return value, [issue]
    issues: list[Issue] = []
    if node.integer:
        if isinstance(value, float) and not value.is_integer():
            body: dict[str, Any] = {"expected": "int", "format": "safeint", "code": "invalid_type"}
            return value, [Issue(body, "Invalid input: expected int, received number")]
        value = int(value)
        if abs(value) > MAX_SAFE_INTEGER:
            issues.append(_unsafe_int(value))
    elif node.coerce:
        value = _int_if_safe(value)
    for bound in node.lower:
        if not (value >= bound.value if bound.inclusive else value > bound.value):
            issues.append(_bound_issue("too_small", "minimum", bound))
    for bound in node.upper:
        if not (value <= bound.value if bound.inclusive else value < bound.value):
            issues.append(_bound_issue("too_big", "maximum", bound))
    return value, issues


def _unsafe_int(value: int) -> Issue:
    note = "Integers must be within the safe integer range."
    if value > 0:
        body: dict[str, Any] = {"code": "too_big", "maximum": MAX_SAFE_INTEGER, "note": note, "origin": "int"}
        return Issue(body, f"Too big: expected int to be <{MAX_SAFE_INTEGER}", can_continue=True)
    body = {"code": "too_small", "minimum": -MAX_SAFE_INTEGER, "note": note, "origin": "int"}
    return Issue(body, f"Too small: expected int to be >{-MAX_SAFE_INTEGER}", can_continue=True)


def _bound_issue(code: str, key: str, bound: Bound) -> Issue:
    body: dict[str, Any] = {"origin": "number", "code": code, key: bound.value, "inclusive": bound.inclusive}
    if code == "too_small":
        text = f"Too small: expected number to be {'>=' if bound.inclusive else '>'}"
    else:
        text = f"Too big: expected number to be {'<=' if bound.inclusive else '<'}"
    return Issue(body, text + js_number(bound.value), can_continue=True)


def _int_if_safe(value: float) -> float:
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)
    return value


def _run_values(node: ValuesNode, value: Any) -> Result:
    if any(_same_value_zero(value, v) for v in node.values):
        return value, []
    values = [v.value if isinstance(v, enum.Enum) else v for v in node.values]
    if len(values) == 1:
        message = f"Invalid input: expected {_primitive(values[0])}"
    else:
        message = "Invalid option: expected one of " + "|".join(_primitive(v) for v in values)
    return value, [Issue({"code": "invalid_value", "values": values}, message)]


def _same_value_zero(a: Any, b: Any) -> bool:
    """JavaScript's Set membership: no cross-type equality (True is not 1), NaN equals NaN."""
    if isinstance(b, enum.Enum):
        b = b.value
    if is_number(a) and is_number(b):
        return bool(a == b or (math.isnan(a) and math.isnan(b)))
    return type(a) is type(b) and a == b


def _invalid_type(expected: str, value: Any) -> Issue:
    return Issue(
        {"expected": expected, "code": "invalid_type"},
        f"Invalid input: expected {expected}, received {_parsed_type(value)}",
    )


def _prefixed(seg: str | int, issues: list[Issue]) -> list[Issue]:
    for issue in issues:
        issue.path.insert(0, seg)
    return issues


def _parsed_type(value: Any) -> str:
    """zod's `parsedType`: the noun after "received"."""
    if value is MISSING:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if is_number(value):
        return "NaN" if math.isnan(value) else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return "object"


def _primitive(value: Any) -> str:
    """zod's `stringifyPrimitive`: strings in bare double quotes (no escaping), the rest as `${v}`."""
    if isinstance(value, str):
        return f'"{value}"'
    return js_string(value)
