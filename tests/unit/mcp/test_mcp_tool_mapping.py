from __future__ import annotations

import mcp_types as types
import pytest

from controlplane.core.calls.tool import Attachment, ToolResult
from controlplane.mcp.tools import forced_schema, sanitize, to_tool_result, tool_id


@pytest.mark.parametrize(
    ("server", "tool", "expected"),
    [
        ("github", "create_issue", "github_create_issue"),
        ("my server", "get.thing", "my_server_get_thing"),
        ("a-b", "c-d", "a-b_c-d"),
        ("ünï", "tool/x:y", "_n__tool_x_y"),
        ("s", "emoji🙂", "s_emoji__"),  # two UTF-16 code units, as upstream's regex sees them
        ("", "t", "_t"),
    ],
)
def test_tool_id(server: str, tool: str, expected: str) -> None:
    assert tool_id(server, tool) == expected


def test_sanitize_keeps_allowed_characters() -> None:
    allowed = "azAZ09_-"
    assert sanitize(allowed) == allowed
    assert sanitize("a.b c@d") == "a_b_c_d"


def test_forced_schema_adds_what_is_missing() -> None:
    assert forced_schema({"type": "object"}) == {"type": "object", "properties": {}, "additionalProperties": False}
    assert forced_schema(None) == {"type": "object", "properties": {}, "additionalProperties": False}
    assert forced_schema({}) == {"type": "object", "properties": {}, "additionalProperties": False}


def test_forced_schema_overrides_type_and_additional_properties_and_keeps_the_rest() -> None:
    given = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "array",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": True,
        "$defs": {"X": {"type": "integer"}},
    }
    forced = forced_schema(given)
    assert forced == {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
        "$defs": {"X": {"type": "integer"}},
    }
    assert list(forced) == list(given)  # key order as a JS object spread keeps it
    assert given["additionalProperties"] is True  # the server's listing is not modified


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def test_text_parts_are_joined_with_a_blank_line_and_empty_parts_count() -> None:
    result = to_tool_result(types.CallToolResult(content=[_text("a"), _text(""), _text("b\n")]))
    assert result == ToolResult(title="", output="a\n\n\n\nb\n", metadata={}, attachments=[])


def test_no_content_is_empty_output() -> None:
    assert to_tool_result(types.CallToolResult(content=[])) == ToolResult(title="", output="", metadata={})


def test_images_and_resources() -> None:
    result = to_tool_result(types.CallToolResult(content=[
        types.ImageContent(type="image", data="AAAA", mime_type="image/webp"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="file:///a", text="res")),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="file:///e", text="")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(uri="mem://b", blob="Qk0=")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///c.pdf", blob="JVBE", mime_type="application/pdf")),
        types.AudioContent(type="audio", data="UklGRg==", mime_type="audio/wav"),
        types.ResourceLink(type="resource_link", uri="file:///l", name="l"),
        _text("tail"),
    ]))
    assert result.output == "res\n\ntail"
    assert result.attachments == [
        Attachment(mime="image/webp", url="data:image/webp;base64,AAAA"),
        Attachment(mime="application/octet-stream", url="data:application/octet-stream;base64,Qk0=",
                   filename="mem://b"),
        Attachment(mime="application/pdf", url="data:application/pdf;base64,JVBE", filename="file:///c.pdf"),
    ]


def test_is_error_results_are_output_as_upstream_treats_them() -> None:
    result = to_tool_result(types.CallToolResult(content=[_text("no such repo")], is_error=True))
    assert result == ToolResult(title="", output="no such repo", metadata={}, attachments=[])
