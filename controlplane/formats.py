"""Tool lists and tool results in the shapes LLM providers take: OpenAI's Chat Completions, Anthropic's
Messages and Gemini's function declarations.

Each `to_*` takes what `list_tools` returns (a ListToolsResponse, or any iterable of ToolDefinition messages).
The schemas the platform lists are zod's JSON Schema (draft 2020-12, with `$schema` and, on some nested
objects, zod's own `ref`); providers each accept a different dialect, so every conversion drops what its
provider does not take and keeps the meaning in the description instead, where the model still reads it.

OpenAI's strict mode accepts a narrow subset: every object closed (`additionalProperties: false`), every
property listed in `required` (an optional one becomes nullable: null means "not given"), and no object
whose keys are not known in advance. Such a free-form object (`batch`'s `parameters`, a record, an `any`)
becomes a string holding JSON, which the description says; `from_openai_arguments` undoes both changes
before the call reaches the platform. Gemini cannot describe a free-form object either, and gets the same
string treatment (`from_gemini_args`).
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.client_types import ToolOutcome
from controlplane.errors import InvalidArgumentError
from controlplane.v1 import tool_pb2

Schema = dict[str, Any]
Listing = tool_pb2.ListToolsResponse | Iterable[tool_pb2.ToolDefinition]

STRICT_KEYWORDS = frozenset({"type", "description", "properties", "required", "additionalProperties", "items",
                             "enum", "const", "anyOf"})
"""What a strict schema keeps: the keywords every strict-mode implementation takes (newer ones take more)."""
GEMINI_KEYWORDS = frozenset({"type", "description", "properties", "required", "items", "enum", "nullable",
                             "minItems", "maxItems", "minimum", "maximum", "anyOf", "format"})
"""Gemini's OpenAPI 3.0 subset, keeping to the fields its function declarations have long accepted."""
CONSTRAINTS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
               "maxLength", "pattern", "format", "minItems", "maxItems", "uniqueItems", "default")
"""Dropped keywords worth telling the model, in this order, as a sentence appended to the description."""
JSON_STRING_NOTE = "Give this as a string holding a JSON value"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_GEMINI_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")


# -- the listing ----------------------------------------------------------------------------------------


def _tools(listing: Listing, name_rule: re.Pattern[str], provider: str) -> list[tuple[str, str, Schema]]:
    tools = listing.tools if isinstance(listing, tool_pb2.ListToolsResponse) else listing
    found = []
    for tool in tools:
        if not name_rule.match(tool.id):
            raise InvalidArgumentError(f"tool {tool.id!r}: {provider} does not accept this name ({name_rule.pattern})")
        schema = json.loads(tool.parameters_json_schema or "{}") or {"type": "object", "properties": {}}
        found.append((tool.id, tool.description, schema))
    return found


def _schema_of(listing: Listing, name: str) -> Schema:
    tools = listing.tools if isinstance(listing, tool_pb2.ListToolsResponse) else listing
    for tool in tools:
        if tool.id == name:
            schema: Schema = json.loads(tool.parameters_json_schema or "{}")
            return inline_refs(schema)
    raise InvalidArgumentError(f"the model called {name!r}, which is not in the tool listing")


def plain_schema(schema: Schema) -> Schema:
    """The schema without `$schema` and zod's `ref` (at any depth), otherwise unchanged."""
    if isinstance(schema, dict):
        return {k: plain_schema(v) for k, v in schema.items() if k not in ("$schema", "ref")}
    if isinstance(schema, list):
        return [plain_schema(v) for v in schema]
    return schema


# -- what cannot be said in a closed schema -------------------------------------------------------------


def inline_refs(schema: Schema) -> Schema:
    """`schema` with its local `$ref`s (`#/$defs/X`, `#/definitions/X`, as zod emits for `.meta({id})` and
    `z.lazy`) replaced by what they name; a recursive one becomes `{}` (free-form: said as a JSON string by
    the dialects that cannot refer)."""
    definitions = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name in seen or name not in definitions or not ref.startswith(("#/$defs/", "#/definitions/")):
                return {k: v for k, v in node.items() if k == "description"}
            target = resolve(definitions[name], (*seen, name))
            return {**target, **{k: v for k, v in node.items() if k == "description"}}
        return {k: resolve(v, seen) for k, v in node.items() if k not in ("$defs", "definitions")}

    resolved: Schema = resolve(schema, ())
    return resolved


def _is_free_form(node: Schema) -> bool:
    """An object whose keys are not known (record, loose object without properties) or an `any`."""
    if not isinstance(node, dict):
        return False
    meaningful = {k for k in node if k not in ("description", "$schema", "ref", "default", "title")}
    if not meaningful:
        return True  # {} is zod's any/unknown
    if node.get("type") == "object":
        return not node.get("properties") and node.get("additionalProperties", True) is not False
    return False


def _note(node: Schema, kept: frozenset[str]) -> str:
    said = []
    for key in CONSTRAINTS:
        if key in node and key not in kept:
            said.append(f"{key} {json.dumps(node[key])}")
    return ("(" + ", ".join(said) + ")") if said else ""


def _describe(description: str | None, *notes: str) -> str | None:
    text = description or ""
    for note in notes:
        if note:
            text = f"{text}{'' if not text or text[-1] in '.!?:)' else '.'} {note}" if text else note
    return text or None


def _as_json_string(node: Schema) -> Schema:
    note = JSON_STRING_NOTE + (" (an object)" if node.get("type") == "object" else "") + "."
    out: Schema = {"type": "string"}
    described = _describe(node.get("description"), note)
    if described:
        out["description"] = described
    return out


# -- OpenAI ---------------------------------------------------------------------------------------------


def strict_schema(schema: Schema) -> Schema:
    """`schema` following OpenAI's strict-mode rules (see the module's docstring)."""
    root = _strict(inline_refs(schema))
    if root.get("type") != "object":
        raise InvalidArgumentError("a tool's parameters must be an object schema")
    return root


def _strict(node: Schema) -> Schema:
    if _is_free_form(node):
        return _as_json_string(node)
    out: Schema = {}
    if "anyOf" in node:
        out["anyOf"] = [_strict(option) for option in node["anyOf"]]
    for key in ("type", "enum", "const"):
        if key in node:
            out[key] = copy.deepcopy(node[key])
    if node.get("type") == "object" or "properties" in node:
        properties = node.get("properties") or {}
        required = set(node.get("required") or [])
        out["type"] = "object"
        out["properties"] = {name: (_strict(sub) if name in required else _nullable(_strict(sub)))
                             for name, sub in properties.items()}
        out["required"] = list(properties)
        out["additionalProperties"] = False
    if node.get("type") == "array" and "items" in node:
        out["items"] = _strict(node["items"]) if isinstance(node["items"], dict) else _as_json_string({})
    described = _describe(node.get("description"), _note(node, STRICT_KEYWORDS))
    if described:
        out = {"description": described, **out}
    return out


def _nullable(node: Schema) -> Schema:
    """`node` also accepting null (the strict spelling of an optional property)."""
    out = dict(node)
    kind = out.get("type")
    if isinstance(kind, str) and "anyOf" not in out:
        out["type"] = [kind, "null"]
        if "const" in out:
            out["enum"] = [out.pop("const")]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    if isinstance(kind, list):
        if "null" not in kind:
            out["type"] = [*kind, "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    description = out.pop("description", None)
    options = out["anyOf"] if set(out) == {"anyOf"} else [out]
    wrapped: Schema = {"anyOf": [*options, {"type": "null"}]}
    return {"description": description, **wrapped} if description else wrapped


def to_openai(listing: Listing, strict: bool = False) -> list[dict[str, Any]]:
    """Chat Completions `tools` entries: `{"type": "function", "function": {name, description, parameters,
    strict}}`. With `strict`, turn the model's arguments back with `from_openai_arguments(..., strict=True)`."""
    entries = []
    for name, description, schema in _tools(listing, _NAME, "OpenAI"):
        parameters = strict_schema(schema) if strict else plain_schema(schema)
        entries.append({"type": "function", "function": {
            "name": name, "description": description, "parameters": parameters, "strict": strict,
        }})
    return entries


def from_openai_arguments(listing: Listing, name: str, arguments: str | Mapping[str, Any], *,
                          strict: bool = False) -> dict[str, Any]:
    """A tool call's `arguments` (the JSON string or its object) as the platform's arguments: with `strict`,
    nulls of optional properties are dropped and JSON strings standing for free-form values are parsed."""
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    except (ValueError, RecursionError) as exc:  # the model's text: malformed or absurdly nested
        raise InvalidArgumentError(f"the arguments of {name!r} are not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"the arguments of {name!r} are not a JSON object")
    if not strict:
        return value
    restored: dict[str, Any] = _restore(_schema_of(listing, name), value, drop_nulls=True)
    return restored


def _restore(node: Schema, value: Any, *, drop_nulls: bool) -> Any:
    if _is_free_form(node):
        if isinstance(value, str):
            try:
                return json.loads(value)
            except (ValueError, RecursionError):
                return value  # the tool's validation says what is wrong, in its own words
        return value
    if isinstance(value, dict) and isinstance(node.get("properties"), dict):
        required = set(node.get("required") or [])
        out = {}
        for key, item in value.items():
            sub = node["properties"].get(key)
            if sub is None:
                out[key] = item
            elif item is None and drop_nulls and key not in required:
                continue
            else:
                out[key] = _restore(sub, item, drop_nulls=drop_nulls)
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_restore(node["items"], item, drop_nulls=drop_nulls) for item in value]
    return value


def openai_tool_message(call_id: str, outcome: ToolOutcome) -> dict[str, Any]:
    """The `{"role": "tool"}` message answering a tool call. Chat Completions tool messages hold text, so
    attachments are named in it; send images on with `openai_attachment_message`."""
    if not outcome.ok:
        return {"role": "tool", "tool_call_id": call_id, "content": f"Error: {outcome.error}"}
    text = outcome.text
    for item in outcome.attachments:
        text += f"\n[attachment {item.filename or 'file'}: {item.mime}, {len(item.data)} bytes]"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def openai_attachment_message(outcome: ToolOutcome) -> dict[str, Any] | None:
    """A user message carrying the outcome's image attachments, or None when it has none."""
    parts = [{"type": "image_url", "image_url": {"url": _data_url(a.mime, a.data)}}
             for a in outcome.attachments if a.mime.startswith("image/")]
    return {"role": "user", "content": parts} if parts else None


# -- Anthropic ------------------------------------------------------------------------------------------


def to_anthropic(listing: Listing) -> list[dict[str, Any]]:
    """Messages API `tools` entries: `{name, description, input_schema}`."""
    return [{"name": name, "description": description, "input_schema": plain_schema(schema)}
            for name, description, schema in _tools(listing, _NAME, "Anthropic")]


def anthropic_tool_result(tool_use_id: str, outcome: ToolOutcome) -> dict[str, Any]:
    """The `tool_result` content block (for the next user message), images included."""
    if not outcome.ok:
        return {"type": "tool_result", "tool_use_id": tool_use_id, "content": outcome.error or "", "is_error": True}
    content: list[dict[str, Any]] = [{"type": "text", "text": outcome.text}]
    for item in outcome.attachments:
        if item.mime.startswith("image/"):
            content.append({"type": "image", "source": {
                "type": "base64", "media_type": item.mime, "data": base64.b64encode(item.data).decode(),
            }})
        else:
            content.append({"type": "text", "text": f"[attachment {item.filename or 'file'}: {item.mime}]"})
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}


# -- Gemini ---------------------------------------------------------------------------------------------


def gemini_schema(schema: Schema) -> Schema:
    """`schema` in Gemini's OpenAPI subset: upper-case types, `nullable` instead of null types, no
    `additionalProperties`/`$schema`/`const`, free-form objects as JSON strings."""
    return _gemini(inline_refs(schema))


_GEMINI_TYPES = {"string": "STRING", "number": "NUMBER", "integer": "INTEGER", "boolean": "BOOLEAN",
                 "array": "ARRAY", "object": "OBJECT"}


def _gemini(node: Schema) -> Schema:
    if _is_free_form(node):
        return _gemini(_as_json_string(node))
    out: Schema = {}
    kind = node.get("type")
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        if "null" in kind:
            out["nullable"] = True
        kind = rest[0] if len(rest) == 1 else None
        if len(rest) > 1:
            out["anyOf"] = [_gemini({**node, "type": k}) for k in rest]
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) < len(node["anyOf"]):
            out["nullable"] = True
        if len(options) == 1:
            inner = _gemini(options[0])
            inner.update({k: v for k, v in out.items() if k == "nullable"})
            return _with_description(inner, node)
        out["anyOf"] = [_gemini(o) for o in options]
    if isinstance(kind, str) and kind in _GEMINI_TYPES:
        out["type"] = _GEMINI_TYPES[kind]
    enum = node.get("enum", [node["const"]] if "const" in node else None)
    if enum is not None and all(isinstance(v, str) for v in enum):
        out.update(type="STRING", format="enum", enum=list(enum))
    if out.get("type") == "OBJECT":
        properties = node.get("properties") or {}
        out["properties"] = {name: _gemini(sub) for name, sub in properties.items()}
        required = [n for n in node.get("required") or [] if n in properties]
        if required:
            out["required"] = required
    if out.get("type") == "ARRAY" and isinstance(node.get("items"), dict):
        out["items"] = _gemini(node["items"])
    for key in ("minItems", "maxItems", "minimum", "maximum"):
        if key in node:
            out[key] = node[key]
    return _with_description(out, node, _note(node, GEMINI_KEYWORDS) if enum is None or "enum" in out else
                             f"(one of {json.dumps(enum)})")


def _with_description(out: Schema, node: Schema, note: str = "") -> Schema:
    described = _describe(node.get("description"), note)
    if described:
        out["description"] = described
    return out


def to_gemini(listing: Listing) -> list[dict[str, Any]]:
    """`functionDeclarations` entries: `{name, description, parameters}` (no `parameters` for a tool that
    takes none: Gemini refuses an OBJECT without properties)."""
    declarations = []
    for name, description, schema in _tools(listing, _GEMINI_NAME, "Gemini"):
        declaration: dict[str, Any] = {"name": name, "description": description}
        parameters = gemini_schema(schema)
        if parameters.get("properties"):
            declaration["parameters"] = parameters
        declarations.append(declaration)
    return declarations


def from_gemini_args(listing: Listing, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """A `functionCall`'s `args` as the platform's arguments (JSON strings standing for free-form values parsed)."""
    restored: dict[str, Any] = _restore(_schema_of(listing, name), dict(args), drop_nulls=False)
    return restored


def gemini_function_response(name: str, outcome: ToolOutcome) -> dict[str, Any]:
    """The `functionResponse` part answering a `functionCall`."""
    response: dict[str, Any] = {"output": outcome.text} if outcome.ok else {"error": outcome.error or ""}
    return {"functionResponse": {"name": name, "response": response}}


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
