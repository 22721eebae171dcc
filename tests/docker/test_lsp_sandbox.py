"""The experimental `lsp` tool through the real gRPC API, answered by jedi-language-server in a real sandbox.

Needs an image built with jedi-language-server and its dependencies (sandbox-image/requirements.txt).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.client import PermissionRequest
from controlplane.v1 import tool_pb2
from tests.planes import Plane, workspace_session

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

WS = "/workspace"
FILES = {
    "shapes.py": (
        '"""Shapes."""\n\n\nclass Square:\n    """A square with a side."""\n\n'
        "    def __init__(self, side: int) -> None:\n        self.side = side\n\n"
        "    def area(self) -> int:\n        return self.side * self.side\n\n\n"
        "def make(side: int) -> Square:\n    return Square(side)\n"
    ),
    "main.py": (
        "from shapes import Square, make\n\n\ndef run() -> int:\n    first = make(2)\n"
        "    second = Square(3)\n    return first.area() + second.area()\n"
    ),
    "notes.txt": "not code\n",
}


session_id = workspace_session(FILES, plane="lsp_plane")


async def lsp(plane: Plane, session: str, operation: str, file: str, line: int = 1, character: int = 1,
              **kw: Any) -> Any:
    args = {"operation": operation, "filePath": file, "line": line, "character": character}
    return await plane.client.execute_tool(session, "lsp", args, **kw)


def rng(l1: int, c1: int, l2: int, c2: int) -> dict[str, Any]:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


async def test_lsp_is_listed_with_the_flag(lsp_plane: Plane, session_id: str) -> None:
    listed = await lsp_plane.client.list_tools(session_id)
    ids = [tool.id for tool in listed.tools]
    assert ids.index("lsp") == ids.index("skill") + 1  # apply_patch, between them, is only for gpt models
    schema = json.loads(next(t for t in listed.tools if t.id == "lsp").parameters_json_schema)
    assert schema["properties"]["line"] == {
        "description": "The line number (1-based, as shown in editors)", "type": "integer", "minimum": 1,
        "maximum": 9007199254740991,
    }


async def test_go_to_definition_in_the_sandbox(lsp_plane: Plane, session_id: str) -> None:
    out = await lsp(lsp_plane, session_id, "goToDefinition", "main.py", 5, 13)
    assert out.result is not None
    assert out.result.title == "goToDefinition workspace/main.py:5:13"
    assert out.output == (
        "[\n  {\n"
        f'    "uri": "file://{WS}/shapes.py",\n'
        '    "range": {\n      "start": {\n        "line": 13,\n        "character": 4\n      },\n'
        '      "end": {\n        "line": 13,\n        "character": 8\n      }\n    }\n  }\n]'
    )


async def test_references_hover_and_symbols_in_the_sandbox(lsp_plane: Plane, session_id: str) -> None:
    refs = await lsp(lsp_plane, session_id, "findReferences", f"{WS}/shapes.py", 10, 9)
    assert json.loads(refs.output) == [
        {"uri": f"file://{WS}/main.py", "range": rng(6, 17, 6, 21)},
        {"uri": f"file://{WS}/main.py", "range": rng(6, 33, 6, 37)},
        {"uri": f"file://{WS}/shapes.py", "range": rng(9, 8, 9, 12)},
    ]
    hover = await lsp(lsp_plane, session_id, "hover", "main.py", 6, 14)
    assert json.loads(hover.output)[0]["contents"]["value"] == (
        "class Square(side: int)\n---\nA square with a side.\nFull name: shapes.Square"
    )
    symbols = await lsp(lsp_plane, session_id, "documentSymbol", "shapes.py")
    assert [s["name"] for s in json.loads(symbols.output)] == ["Square", "__init__", "side", "area", "make"]
    blank = await lsp(lsp_plane, session_id, "hover", "main.py", 3, 1)
    assert blank.output == "[\n  null\n]"


async def test_errors_in_the_sandbox(lsp_plane: Plane, session_id: str) -> None:
    missing = await lsp(lsp_plane, session_id, "hover", "gone.py")
    assert missing.error == f"File not found: {WS}/gone.py"
    text = await lsp(lsp_plane, session_id, "hover", "notes.txt")
    assert text.error == "No LSP server available for this file type."
    invalid = await lsp(lsp_plane, session_id, "hover", "main.py", 0, 1)
    assert invalid.error is not None
    assert invalid.error.startswith("The lsp tool was called with invalid arguments: [\n")


async def test_rejected_permission_in_the_sandbox(lsp_plane: Plane, session_id: str) -> None:
    seen: list[PermissionRequest] = []

    async def reject(request: PermissionRequest) -> tuple[int, str]:
        seen.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    out = await lsp(lsp_plane, session_id, "hover", "/etc/os-release.py", on_permission=reject)
    assert out.error == "The user rejected permission to use this specific tool call."
    assert [(r.permission, list(r.patterns)) for r in seen] == [("external_directory", ["/etc/*"])]


@pytest.mark.timeout(300)
async def test_workspace_symbol_in_the_sandbox(lsp_plane: Plane, session_id: str) -> None:
    out = await lsp(lsp_plane, session_id, "workspaceSymbol", "main.py")
    names = {s["name"] for s in json.loads(out.output)}
    assert {"Square", "make", "run"} <= names
