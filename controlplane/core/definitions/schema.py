"""A tool's pydantic parameters seen as the zod schema upstream declares, and its JSON Schema.

`parameters_schema` gives exactly what zod 4.1.8's `z.toJSONSchema` (draft 2020-12, output mode)
emits for the equivalent zod object, key order included. The mapping, field by field:

- `str`, `bool`, `float` → `z.string()`, `z.boolean()`, `z.number()`; `int` → `z.number().int()`
- `Literal["a"]` → `z.literal("a")`; `Literal["a", "b"]` or an `Enum` → `z.enum([...])`
- `list[X]` → `z.array(X)`; `dict[str, X]` → `z.record(z.string(), X)`; a nested model → `z.object`
  (`extra="forbid"` → `z.strictObject`, `extra="allow"` → `z.looseObject`); `Any` → `z.any()`
- `X | Y` → `z.union([X, Y])`; a required `X | None` → `X.nullable()`
- default `None` → `.optional()`; any other default → `.default(v)`; `ge/gt/le/lt`,
  `min_length/max_length` → `.min/.gt/.max/.lt`; `Annotated[float, COERCE]` → `z.coerce.number()`
- `Field(description=...)` → `.describe(...)`, applied last (so zod emits it before `default`).
"""

from __future__ import annotations

import copy
import enum
import functools
import types
import typing
from dataclasses import dataclass, replace
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from opencode_semantics.javascript import MAX_SAFE_INTEGER, UNDEFINED

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class Coerce:
    """Marks a number as `z.coerce.number()`: the value goes through JavaScript's `Number()` first."""


COERCE = Coerce()


MISSING = UNDEFINED
"""A key absent from the arguments: JavaScript's `undefined`."""


@dataclass(frozen=True)
class Bound:
    value: float
    inclusive: bool


@dataclass(frozen=True)
class StringNode:
    min_length: int | None = None
    max_length: int | None = None
    description: str | None = None


@dataclass(frozen=True)
class NumberNode:
    integer: bool = False
    coerce: bool = False
    lower: tuple[Bound, ...] = ()
    upper: tuple[Bound, ...] = ()
    description: str | None = None


@dataclass(frozen=True)
class BooleanNode:
    description: str | None = None


@dataclass(frozen=True)
class ValuesNode:
    """`z.enum` (`literal=False`) or `z.literal` (`literal=True`); both report `invalid_value`."""

    values: tuple[Any, ...]
    literal: bool
    description: str | None = None


@dataclass(frozen=True)
class ArrayNode:
    item: Node
    min_items: int | None = None
    max_items: int | None = None
    description: str | None = None


@dataclass(frozen=True)
class RecordNode:
    value: Node
    description: str | None = None


@dataclass(frozen=True)
class UnionNode:
    options: tuple[Node, ...]
    description: str | None = None


@dataclass(frozen=True)
class NullableNode:
    inner: Node
    description: str | None = None


@dataclass(frozen=True)
class AnyNode:
    description: str | None = None


ExtraMode = Literal["strip", "strict", "loose"]


@dataclass(frozen=True)
class FieldSpec:
    """One property: `optional` is `.optional()`; a `default` other than MISSING is `.default(v)`."""

    key: str
    node: Node
    optional: bool = False
    default: Any = MISSING


@dataclass(frozen=True)
class ObjectNode:
    fields: tuple[FieldSpec, ...]
    extra: ExtraMode = "strip"
    description: str | None = None


Node = (
    StringNode | NumberNode | BooleanNode | ValuesNode | ArrayNode | RecordNode | UnionNode | NullableNode | AnyNode
    | ObjectNode
)


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema zod's `toJSONSchema` gives for `model`'s zod equivalent (a fresh dict)."""
    return {"$schema": JSON_SCHEMA_DIALECT, **_emit(object_node(model))}


@functools.cache
def object_node(model: type[BaseModel]) -> ObjectNode:
    """The zod object equivalent to `model` (cached: models are immutable classes)."""
    return _object_node(model, ())


# ---------------------------------------------------------------------------------------------
# pydantic model -> zod-like nodes


def _object_node(model: type[BaseModel], seen: tuple[type[BaseModel], ...]) -> ObjectNode:
    if model in seen:
        raise TypeError(f"{model.__name__}: recursive parameter models are not supported")
    seen = (*seen, model)
    extra = model.model_config.get("extra")
    mode: ExtraMode = "strict" if extra == "forbid" else "loose" if extra == "allow" else "strip"
    specs = tuple(_field_spec(name, info, seen) for name, info in model.model_fields.items())
    return ObjectNode(fields=specs, extra=mode)


def _field_spec(name: str, info: FieldInfo, seen: tuple[type[BaseModel], ...]) -> FieldSpec:
    key = info.alias or name
    if info.is_required():
        node = _node(info.annotation, list(info.metadata), seen)
        return FieldSpec(key, _described(node, info.description))
    default = info.get_default(call_default_factory=True)
    if default is None:
        # `X | None = None` is zod's `.optional()`: the key may be absent, but null stays invalid.
        node = _node(_without_none(info.annotation), list(info.metadata), seen)
        return FieldSpec(key, _described(node, info.description), optional=True)
    node = _node(info.annotation, list(info.metadata), seen)
    return FieldSpec(key, _described(node, info.description), default=_plain(default))


def _described(node: Node, description: str | None) -> Node:
    return node if description is None else replace(node, description=description)


def _without_none(annotation: Any) -> Any:
    if _is_union(annotation):
        rest = tuple(a for a in typing.get_args(annotation) if a is not type(None))
        if len(rest) == 1:
            return rest[0]
        return typing.Union[rest]  # noqa: UP007 (a runtime union of a tuple of types)
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _node(annotation: Any, metadata: list[Any], seen: tuple[type[BaseModel], ...]) -> Node:
    description: str | None = None
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        metadata = [*extra, *metadata]
    constraints: list[Any] = []
    coerce = False
    for item in metadata:
        if isinstance(item, FieldInfo):
            description = item.description or description
            constraints += item.metadata
        elif isinstance(item, Coerce):
            coerce = True
        else:
            constraints.append(item)
    node = _bare_node(annotation, constraints, coerce, seen)
    return _described(node, description)


def _bare_node(annotation: Any, constraints: list[Any], coerce: bool, seen: tuple[type[BaseModel], ...]) -> Node:
    if _is_union(annotation):
        args = typing.get_args(annotation)
        options = tuple(_node(a, list(constraints), seen) for a in args if a is not type(None))
        inner = options[0] if len(options) == 1 else UnionNode(options)
        return NullableNode(inner) if type(None) in args else inner
    if annotation is Any or annotation is object:
        _no_constraints(annotation, constraints)
        return AnyNode()
    if annotation is str:
        low, high = _lengths(constraints)
        return StringNode(min_length=low, max_length=high)
    if annotation is bool:
        _no_constraints(annotation, constraints)
        return BooleanNode()
    if annotation is int or annotation is float:
        return _number_node(annotation is int, coerce, constraints)
    if typing.get_origin(annotation) is Literal:
        _no_constraints(annotation, constraints)
        values = tuple(typing.get_args(annotation))
        return ValuesNode(values, literal=len(values) == 1 or not all(isinstance(v, str) for v in values))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        _no_constraints(annotation, constraints)
        return ValuesNode(tuple(m.value for m in annotation), literal=False)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        _no_constraints(annotation, constraints)
        return _object_node(annotation, seen)
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        low, high = _lengths(constraints)
        return ArrayNode(_node(item, [], seen), min_items=low, max_items=high)
    if origin is dict:
        key, value = typing.get_args(annotation) or (str, Any)
        if key is not str:
            raise TypeError(f"{annotation}: only string-keyed dicts have a zod equivalent here")
        _no_constraints(annotation, constraints)
        return RecordNode(_node(value, [], seen))
    raise TypeError(f"{annotation!r}: no zod equivalent is supported for this parameter type")


def _lengths(constraints: list[Any]) -> tuple[int | None, int | None]:
    low: int | None = None
    high: int | None = None
    for c in constraints:
        if isinstance(c, annotated_types.MinLen):
            low = c.min_length if low is None else max(low, c.min_length)
        elif isinstance(c, annotated_types.MaxLen):
            high = c.max_length if high is None else min(high, c.max_length)
        else:
            raise TypeError(f"{c!r}: unsupported constraint for a string or list")
    return low, high


def _number_node(integer: bool, coerce: bool, constraints: list[Any]) -> NumberNode:
    lower: list[Bound] = []
    upper: list[Bound] = []
    for c in constraints:
        if isinstance(c, annotated_types.Ge):
            lower.append(Bound(_num(c.ge), True))
        elif isinstance(c, annotated_types.Gt):
            lower.append(Bound(_num(c.gt), False))
        elif isinstance(c, annotated_types.Le):
            upper.append(Bound(_num(c.le), True))
        elif isinstance(c, annotated_types.Lt):
            upper.append(Bound(_num(c.lt), False))
        else:
            raise TypeError(f"{c!r}: unsupported constraint for a number")
    return NumberNode(integer=integer, coerce=coerce, lower=tuple(lower), upper=tuple(upper))


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{value!r}: number bounds must be numbers")
    return value


def _no_constraints(annotation: Any, constraints: list[Any]) -> None:
    if constraints:
        raise TypeError(f"{annotation!r}: unsupported constraints {constraints!r}")


def _plain(value: Any) -> Any:
    """A default as zod stores it in the schema: JSON data (what `JSON.parse(JSON.stringify(v))` keeps)."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return copy.copy(value)


# ---------------------------------------------------------------------------------------------
# nodes -> JSON Schema (key order as zod's generator leaves it)


def _emit(node: Node, default: Any = MISSING) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node.description is not None:
        out["description"] = node.description
    if default is not MISSING:
        out["default"] = copy.deepcopy(default)
    out.update(_emit_body(node))
    return out


def _emit_body(node: Node) -> dict[str, Any]:
    match node:
        case StringNode():
            out: dict[str, Any] = {"type": "string"}
            if node.min_length is not None:
                out["minLength"] = node.min_length
            if node.max_length is not None:
                out["maxLength"] = node.max_length
            return out
        case NumberNode():
            return _emit_number(node)
        case BooleanNode():
            return {"type": "boolean"}
        case ValuesNode():
            return _emit_values(node)
        case ArrayNode():
            out = {}
            if node.min_items is not None:
                out["minItems"] = node.min_items
            if node.max_items is not None:
                out["maxItems"] = node.max_items
            return {**out, "type": "array", "items": _emit(node.item)}
        case RecordNode():
            return {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": _emit(node.value)}
        case UnionNode():
            return {"anyOf": [_emit(o) for o in node.options]}
        case NullableNode():
            return {"anyOf": [_emit(node.inner), {"type": "null"}]}
        case AnyNode():
            return {}
        case ObjectNode():
            return _emit_object(node)
    raise AssertionError(node)


def _emit_object(node: ObjectNode) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "properties": {f.key: _emit(f.node, f.default) for f in node.fields},
    }
    required = [f.key for f in node.fields if not f.optional]
    if required:
        out["required"] = required
    out["additionalProperties"] = {} if node.extra == "loose" else False
    return out


def number_bag(node: NumberNode) -> dict[str, float]:
    """zod's bag of bounds: an int starts at the safe-integer range, each check only narrows it."""
    bag: dict[str, float] = {}
    if node.integer:
        bag = {"minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER}
    for b in node.lower:
        key = "minimum" if b.inclusive else "exclusiveMinimum"
        if b.value > bag.get(key, float("-inf")):
            bag[key] = b.value
    for b in node.upper:
        key = "maximum" if b.inclusive else "exclusiveMaximum"
        if b.value < bag.get(key, float("inf")):
            bag[key] = b.value
    return bag


def _emit_number(node: NumberNode) -> dict[str, Any]:
    bag = number_bag(node)
    out: dict[str, Any] = {"type": "integer" if node.integer else "number"}
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if exclusive in bag:
            out[exclusive] = _int_if_integral(bag[exclusive])
        if inclusive in bag:
            out[inclusive] = _int_if_integral(bag[inclusive])
            if exclusive in bag:
                # zod keeps whichever bound is tighter.
                ex, inc = bag[exclusive], bag[inclusive]
                exclusive_wins = ex >= inc if inclusive == "minimum" else ex <= inc
                del out[inclusive if exclusive_wins else exclusive]
    return out


def _emit_values(node: ValuesNode) -> dict[str, Any]:
    values = [_plain(v) for v in node.values]
    if not node.literal:
        out: dict[str, Any] = {}
        if all(_is_number(v) for v in values):
            out["type"] = "number"
        if all(isinstance(v, str) for v in values):
            out["type"] = "string"
        return {**out, "enum": values}
    if len(values) == 1:
        return {"type": _js_typeof(values[0]), "const": values[0]}
    out = {}
    if all(_is_number(v) for v in values):
        out["type"] = "number"
    if all(isinstance(v, str) for v in values):
        out["type"] = "string"
    if all(isinstance(v, bool) for v in values):
        out["type"] = "string"  # zod 4.1.8 says "string" for an all-boolean literal; kept for fidelity
    if all(v is None for v in values):
        out["type"] = "null"
    return {**out, "enum": values}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _js_typeof(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object"


def _int_if_integral(value: float) -> float:
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)
    return value
