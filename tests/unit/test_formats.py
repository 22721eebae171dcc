"""controlplane.formats over every built-in tool: OpenAI (strict mode checked by tests/openai_strict_rules.py),
Anthropic and Gemini shapes, arguments turned back, and tool outcomes as each provider's result message."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from controlplane import formats
from controlplane.client_types import ToolOutcome
from controlplane.core.calls.tool import InitContext
from controlplane.errors import InvalidArgumentError
from controlplane.tools import catalog
from controlplane.v1 import tool_pb2
from tests.openai_strict_rules import strict_violations

GEMINI_KEYS = {"type", "format", "description", "nullable", "enum", "items", "properties", "required", "minItems",
               "maxItems", "minimum", "maximum", "anyOf"}
GEMINI_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT"}


@pytest.fixture(scope="module")
async def listing() -> tool_pb2.ListToolsResponse:
    """Every built-in tool, listed and unlisted, with the schema ListTools gives."""
    response = tool_pb2.ListToolsResponse()
    for tool_id, info in catalog.implemented().items():
        definition = await info.init(InitContext(agent=None))
        response.tools.add(id=tool_id, description=definition.description,
                           parameters_json_schema=json.dumps(definition.schema()))
    return response


def test_the_listing_holds_what_strict_mode_refuses(listing: tool_pb2.ListToolsResponse) -> None:
    """The raw schemas break the rules: the checker is not one that passes everything."""
    raw: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": t.id, "description": t.description, "strict": True,
                                          "parameters": json.loads(t.parameters_json_schema)}}
        for t in listing.tools
    ]
    broken = {str(entry["function"]["name"]): strict_violations(entry) for entry in raw}
    assert any("additionalProperties is not false" in p for p in broken["batch"])
    assert any("missing from required" in p for p in broken["read"])
    assert any("'$schema'" in p for p in broken["bash"])
    assert any("'ref'" in p for p in broken["question"])


def test_every_builtin_tool_is_valid_in_openai_strict_mode(listing: tool_pb2.ListToolsResponse) -> None:
    entries = formats.to_openai(listing, strict=True)
    assert [e["function"]["name"] for e in entries] == [t.id for t in listing.tools]
    assert len(entries) >= 20
    for entry in entries:
        assert strict_violations(entry) == [], entry["function"]["name"]


def test_strict_mode_makes_optional_properties_nullable_and_free_form_objects_strings(
    listing: tool_pb2.ListToolsResponse,
) -> None:
    by_name = {e["function"]["name"]: e["function"]["parameters"] for e in formats.to_openai(listing, strict=True)}
    read = by_name["read"]
    assert read["required"] == ["filePath", "offset", "limit"]
    assert read["properties"]["offset"]["type"] == ["number", "null"]
    assert read["properties"]["filePath"]["type"] == "string"
    call = by_name["batch"]["properties"]["tool_calls"]["items"]["properties"]["parameters"]
    assert call["type"] == "string"
    assert "JSON" in call["description"]
    tokens = by_name["codesearch"]["properties"]["tokensNum"]
    assert "minimum 1000" in tokens["description"]
    assert "default 5000" in tokens["description"]


def test_strict_arguments_are_turned_back(listing: tool_pb2.ListToolsResponse) -> None:
    arguments = json.dumps({"tool_calls": [{"tool": "read", "parameters": json.dumps({"filePath": "/w/a"})}]})
    assert formats.from_openai_arguments(listing, "batch", arguments, strict=True) == {
        "tool_calls": [{"tool": "read", "parameters": {"filePath": "/w/a"}}],
    }
    model_said = {"filePath": "/w/a", "offset": None, "limit": 5}
    assert formats.from_openai_arguments(listing, "read", model_said, strict=True) == {"filePath": "/w/a", "limit": 5}
    assert formats.from_openai_arguments(listing, "read", model_said) == model_said
    with pytest.raises(InvalidArgumentError, match="not in the tool listing"):
        formats.from_openai_arguments(listing, "nope", "{}", strict=True)
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        formats.from_openai_arguments(listing, "read", '{"filePath": ', strict=True)
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        formats.from_openai_arguments(listing, "read", "[" * 100_000 + "]" * 100_000)
    nested = json.dumps({"tool_calls": [{"tool": "read", "parameters": "[" * 100_000 + "]" * 100_000}]})
    kept = formats.from_openai_arguments(listing, "batch", nested, strict=True)
    assert kept["tool_calls"][0]["parameters"].startswith("[[[")  # left for the tool's own validation


def test_plain_openai_and_anthropic_keep_the_schema_without_schema_and_ref(
    listing: tool_pb2.ListToolsResponse,
) -> None:
    openai = formats.to_openai(listing)
    anthropic = formats.to_anthropic(listing)
    for tool, o, a in zip(listing.tools, openai, anthropic, strict=True):
        assert o == {"type": "function", "function": {
            "name": tool.id, "description": tool.description, "parameters": o["function"]["parameters"],
            "strict": False,
        }}
        assert set(a) == {"name", "description", "input_schema"}
        assert a["name"] == tool.id
        assert a["description"] == tool.description
        assert a["input_schema"] == o["function"]["parameters"]
        text = json.dumps(a["input_schema"])
        assert "$schema" not in text
        assert '"ref"' not in text
        assert a["input_schema"]["type"] == "object"
    read = next(a for a in anthropic if a["name"] == "read")
    assert read["input_schema"]["required"] == ["filePath"]


def _gemini_problems(node: Any, where: str) -> list[str]:
    problems = [f"{where}: {k}" for k in node if k not in GEMINI_KEYS]
    if "type" in node and node["type"] not in GEMINI_TYPES:
        problems.append(f"{where}: type {node['type']}")
    if "type" not in node and "anyOf" not in node:
        problems.append(f"{where}: no type")
    if node.get("type") == "OBJECT" and not node.get("properties"):
        problems.append(f"{where}: an OBJECT without properties")
    if "enum" in node and not all(isinstance(v, str) for v in node["enum"]):
        problems.append(f"{where}: a non-string enum")
    for name, sub in (node.get("properties") or {}).items():
        problems += _gemini_problems(sub, f"{where}.{name}")
    if "items" in node:
        problems += _gemini_problems(node["items"], f"{where}[]")
    for i, sub in enumerate(node.get("anyOf") or []):
        problems += _gemini_problems(sub, f"{where}.anyOf[{i}]")
    return problems


def test_gemini_declarations_use_its_openapi_subset(listing: tool_pb2.ListToolsResponse) -> None:
    declarations = formats.to_gemini(listing)
    assert [d["name"] for d in declarations] == [t.id for t in listing.tools]
    for declaration in declarations:
        assert set(declaration) <= {"name", "description", "parameters"}
        if "parameters" in declaration:
            assert _gemini_problems(declaration["parameters"], declaration["name"]) == []
    by_name = {d["name"]: d for d in declarations}
    assert "parameters" not in by_name["todoread"]  # no properties: Gemini refuses an empty OBJECT
    batch_call = by_name["batch"]["parameters"]["properties"]["tool_calls"]["items"]["properties"]
    assert batch_call["parameters"]["type"] == "STRING"
    assert by_name["read"]["parameters"]["required"] == ["filePath"]
    said = {"tool_calls": [{"tool": "glob", "parameters": '{"pattern": "*"}'}]}
    restored = formats.from_gemini_args(listing, "batch", said)
    assert restored == {"tool_calls": [{"tool": "glob", "parameters": {"pattern": "*"}}]}


def test_nullable_and_enum_conversions() -> None:
    schema = {"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["a", "b"]},
        "either": {"anyOf": [{"type": "string"}, {"type": "number"}], "description": "x"},
        "maybe": {"type": ["string", "null"]},
        "record": {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "number"}},
        "anything": {},
    }, "required": ["maybe"], "additionalProperties": False}
    tool = tool_pb2.ToolDefinition(id="t", description="d", parameters_json_schema=json.dumps(schema))
    (entry,) = formats.to_openai([tool], strict=True)
    assert strict_violations(entry) == []
    props = entry["function"]["parameters"]["properties"]
    assert props["mode"]["enum"] == ["a", "b", None]
    assert props["either"] == {"description": "x", "anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]}
    assert props["record"]["type"] == ["string", "null"]
    assert formats.from_openai_arguments([tool], "t", {"record": '{"a": 1}', "anything": "[1]", "maybe": None,
                                                       "mode": None, "either": None}, strict=True) == {
        "record": {"a": 1}, "anything": [1], "maybe": None,
    }
    (declaration,) = formats.to_gemini([tool])
    gemini = declaration["parameters"]["properties"]
    assert gemini["maybe"] == {"type": "STRING", "nullable": True}
    assert gemini["mode"] == {"type": "STRING", "format": "enum", "enum": ["a", "b"]}
    assert _gemini_problems(declaration["parameters"], "t") == []


def test_local_refs_are_inlined_and_a_recursive_one_is_a_json_string() -> None:
    schema = {"type": "object", "$defs": {
        "Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"],
                  "additionalProperties": False},
        "Tree": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}},
                 "required": ["children"], "additionalProperties": False},
    }, "properties": {"at": {"$ref": "#/$defs/Point", "description": "where"}, "tree": {"$ref": "#/$defs/Tree"}},
        "required": ["at", "tree"], "additionalProperties": False}
    tool = tool_pb2.ToolDefinition(id="t", description="d", parameters_json_schema=json.dumps(schema))
    (entry,) = formats.to_openai([tool], strict=True)
    assert strict_violations(entry) == []
    props = entry["function"]["parameters"]["properties"]
    assert props["at"]["properties"] == {"x": {"type": "number"}}
    assert props["at"]["description"] == "where"
    assert props["tree"]["properties"]["children"]["items"]["type"] == "string"  # the recursion, as JSON
    (declaration,) = formats.to_gemini([tool])
    assert _gemini_problems(declaration["parameters"], "t") == []
    said = {"at": {"x": 1}, "tree": {"children": ['{"children": []}']}}
    assert formats.from_openai_arguments([tool], "t", said, strict=True) == {
        "at": {"x": 1}, "tree": {"children": [{"children": []}]},
    }


def test_a_name_a_provider_refuses_is_a_clear_error() -> None:
    tool = tool_pb2.ToolDefinition(id="mcp server/tool", parameters_json_schema='{"type": "object"}')
    with pytest.raises(InvalidArgumentError, match="OpenAI does not accept this name"):
        formats.to_openai([tool])


def _outcome(ok: bool) -> ToolOutcome:
    png = b"\x89PNG\r\n\x1a\nxx"
    result = tool_pb2.ToolResult(title="t", output="done", metadata_json='{"n": 1}', attachments=[
        tool_pb2.Attachment(type="file", mime="image/png", filename="a.png",
                            url="data:image/png;base64," + base64.b64encode(png).decode()),
    ])
    return ToolOutcome("call_1", result, None) if ok else ToolOutcome("call_1", None, "it failed")


def test_outcomes_become_each_providers_result_message() -> None:
    ok, failed = _outcome(True), _outcome(False)
    assert ok.metadata == {"n": 1}
    assert ok.attachments[0].data == b"\x89PNG\r\n\x1a\nxx"
    assert ok.attachments[0].mime == "image/png"
    message = formats.openai_tool_message("call_1", ok)
    assert message["role"] == "tool"
    assert message["tool_call_id"] == "call_1"
    assert message["content"].startswith("done\n[attachment a.png: image/png, 10 bytes]")
    assert formats.openai_tool_message("call_1", failed)["content"] == "Error: it failed"
    images = formats.openai_attachment_message(ok)
    assert images is not None
    assert images["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert formats.openai_attachment_message(failed) is None
    block = formats.anthropic_tool_result("toolu_1", ok)
    assert block["content"][0] == {"type": "text", "text": "done"}
    assert block["content"][1]["source"]["media_type"] == "image/png"
    assert formats.anthropic_tool_result("toolu_1", failed) == {
        "type": "tool_result", "tool_use_id": "toolu_1", "content": "it failed", "is_error": True,
    }
    assert formats.gemini_function_response("read", ok) == {"functionResponse": {"name": "read", "response": {
        "output": "done"}}}
    assert formats.gemini_function_response("read", failed)["functionResponse"]["response"] == {"error": "it failed"}
