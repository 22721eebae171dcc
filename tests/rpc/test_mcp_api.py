"""MCP servers of a session's opencode.json, listed and called through the public gRPC API.

The stdio server (official SDK) is started through the sandbox agent's exec stream; here the agent
is in-process (local provider), tests/docker/test_mcp_sandbox.py runs one in a real container.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from controlplane.v1 import tool_pb2
from tests.planes import Plane, served_plane

SERVER = str(Path(__file__).resolve().parent.parent / "unit" / "mcp" / "stdio_server.py")


plane = served_plane("local")


def config(**servers: object) -> str:
    return json.dumps({"mcp": servers, "permission": {"notes_fails": "deny"}})


async def test_mcp_tools_are_listed_after_builtins_and_callable(plane: Plane) -> None:
    session = await plane.client.create_session(config_json=config(
        notes={"type": "local", "command": [sys.executable, SERVER, "ok"], "environment": {"GREETING": "hello"}},
        broken={"type": "local", "command": [sys.executable, SERVER, "crash"]},
        off={"type": "local", "command": ["true"], "enabled": False},
    ))
    listing = await plane.client.list_tools(session.id)
    ids = [t.id for t in listing.tools]
    mcp_ids = [t.id for t in listing.tools if t.source == tool_pb2.ToolDefinition.MCP]
    assert mcp_ids == [i for i in ids if i.startswith("notes_")]
    assert ids.index("notes_echo") > ids.index("write")
    assert "notes_fails" not in ids  # `"notes_fails": "deny"` hides it, as disabled() says
    assert "notes_weird_name_tool" in ids
    echo = next(t for t in listing.tools if t.id == "notes_echo")
    assert echo.origin == "notes"
    assert json.loads(echo.parameters_json_schema) == {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
        "additionalProperties": False,
    }
    assert [e.origin for e in listing.load_errors] == ["broken"]
    asked: list[tool_pb2.PermissionRequest] = []

    async def once(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        asked.append(request)
        return tool_pb2.PermissionReply.ONCE, ""

    out = await plane.client.execute_tool(session.id, "notes_echo", {"text": "hi there"}, on_permission=once)
    assert out.error is None
    assert out.output == "hi there"
    assert out.result is not None
    assert out.result.title == ""
    out = await plane.client.execute_tool(session.id, "notes_env", {})
    assert out.output.startswith("hello|")
    out = await plane.client.execute_tool(session.id, "notes_mixed", {})
    assert out.output == "first\n\n\n\nsecond\n\nresource text"
    assert out.result is not None
    assert [a.mime for a in out.result.attachments] == ["image/png", "application/octet-stream", "image/gif"]
    await plane.client.delete_session(session.id)
