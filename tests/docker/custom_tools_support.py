"""What the custom-tool docker tests share: a minimal tool file, the custom and plugin tools of a listing, and the
pattern fixtures' workspace with the calls and texts their tests use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane.client import ToolOutcome, allow_once
from controlplane.v1 import tool_pb2
from tests.planes import Plane

ECHO_TS = """import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Echoes its text",
  args: { text: tool.schema.string() },
  async execute(args) { return `echo: ${args.text}` },
})
"""


def custom_tools(listing: tool_pb2.ListToolsResponse) -> dict[str, tool_pb2.ToolDefinition]:
    kinds = (tool_pb2.ToolDefinition.CUSTOM, tool_pb2.ToolDefinition.PLUGIN)
    return {t.id: t for t in listing.tools if t.source in kinds}


FIXTURES = Path(__file__).resolve().parents[1] / "plugin_fixtures" / "patterns"
RETRY = ".\nPlease rewrite the input so it satisfies the expected schema."
CONFIG = {"permission": {"deploy": {"*": "ask", "prod/*": "deny", "lab/*": "allow"}}}


def workspace() -> dict[str, str]:
    """The fixtures as a project's `.opencode` dir; `deps/` is the dir's installed node_modules."""
    files: dict[str, str] = {}
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file():
            relative = path.relative_to(FIXTURES).as_posix()
            if relative.startswith("deps/"):
                relative = "node_modules/" + relative.removeprefix("deps/")
            files[f".opencode/{relative}"] = path.read_text()
    files["README.md"] = "project\n"
    files[".git/HEAD"] = "ref: refs/heads/main\n"  # a git project: the worktree is the workspace
    return files


async def call(plane: Plane, session_id: str, tool: str, args: dict[str, Any] | str) -> ToolOutcome:
    # The fixtures' CONFIG asks for `deploy`: the pattern tests approve each ask once, explicitly.
    return await plane.client.execute_tool(session_id, tool, args, on_permission=allow_once)


async def output_of(plane: Plane, session_id: str, tool: str, args: dict[str, Any]) -> str:
    out = await call(plane, session_id, tool, args)
    assert out.error is None, f"{tool}: {out.error}"
    return out.output


def result_metadata(out: ToolOutcome) -> dict[str, Any]:
    assert out.result is not None, out.error
    parsed: dict[str, Any] = json.loads(out.result.metadata_json)
    return parsed


def invalid(tool: str, issues: list[dict[str, Any]]) -> str:
    return f"The {tool} tool was called with invalid arguments: {json.dumps(issues, indent=2)}{RETRY}"
