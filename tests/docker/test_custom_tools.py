"""Unmodified OpenCode custom tools (TypeScript with the real @opencode-ai/plugin, and Python) in a
real sandbox, through ListTools and ExecuteTool."""

from __future__ import annotations

import json

import pytest

from controlplane.client import allow_once
from controlplane.v1 import tool_pb2
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

MATH_TS = """import { tool } from "@opencode-ai/plugin"
import { double } from "./util.js"

export default tool({
  description: "Adds two numbers",
  args: { a: tool.schema.number().describe("first"), b: tool.schema.number().default(1) },
  async execute(args, ctx) {
    await ctx.metadata({ title: "adding", metadata: { a: args.a } })
    return String(args.a + args.b)
  },
})

export const twice = tool({
  description: "Doubles a number",
  args: { n: tool.schema.number() },
  async execute(args) { return { title: "doubled", output: String(double(args.n)), metadata: { n: args.n } } },
})

export const guarded = tool({
  description: "Asks before it answers",
  args: {},
  async execute(_args, ctx) {
    await ctx.ask({ permission: "guarded", patterns: ["secret"], always: ["*"], metadata: {} })
    return `agent=${ctx.agent} dir=${ctx.directory}`
  },
})
"""
UTIL_TS = "export function double(n: number): number { return n * 2 }\n"
BROKEN_TS = "export default tool({ description: 'x', args: {, })\n"
HELLO_PY = '''from pydantic import BaseModel

from opencode_tool import tool


class Args(BaseModel):
    name: str


async def greet(args, ctx):
    return f"hello {args.name} from {ctx.session_id[:4]}"


default = tool(description="Greets someone", args=Args, execute=greet)
'''
FILES = {
    ".opencode/tool/math.ts": MATH_TS, ".opencode/tool/util.ts": UTIL_TS, ".opencode/tool/broken.ts": BROKEN_TS,
    ".opencode/tools/hello.py": HELLO_PY,
}


session_id = workspace_session(FILES, config_json=json.dumps({"permission": {"guarded": "ask"}}))


async def test_listing_ids_schemas_and_load_errors(docker_plane: Plane, session_id: str) -> None:
    listing = await docker_plane.client.list_tools(session_id)
    custom = {t.id: t for t in listing.tools if t.source == tool_pb2.ToolDefinition.CUSTOM}
    assert list(custom) == ["math", "math_guarded", "math_twice", "util_double", "hello"] or set(custom) >= {
        "math", "math_twice", "math_guarded", "hello",
    }
    assert json.loads(custom["math"].parameters_json_schema) == {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
        "properties": {"a": {"type": "number", "description": "first"}, "b": {"default": 1, "type": "number"}},
        "required": ["a", "b"], "additionalProperties": False,
    }
    assert custom["math"].origin == "/workspace/.opencode/tool/math.ts"
    assert custom["math"].init_ms > 0
    assert [e.origin for e in listing.load_errors] == ["/workspace/.opencode/tool/broken.ts"]


async def test_calls_with_metadata_defaults_and_zod_rejection(docker_plane: Plane, session_id: str) -> None:
    out = await docker_plane.client.execute_tool(session_id, "math", {"a": 2})
    assert out.error is None
    assert out.output == "3"
    live = [e.metadata for e in out.events if e.WhichOneof("event") == "metadata"]
    assert live[0].title == "adding"
    assert json.loads(live[0].metadata_json) == {"a": 2}
    out = await docker_plane.client.execute_tool(session_id, "math_twice", {"n": 21})
    assert out.output == "42"
    assert out.result is not None
    assert out.result.title == "doubled"
    out = await docker_plane.client.execute_tool(session_id, "math", {"a": "x"})
    assert out.error is not None
    assert out.error.startswith("The math tool was called with invalid arguments: [\n  {\n")
    assert out.error.endswith(".\nPlease rewrite the input so it satisfies the expected schema.")


async def test_ask_reaches_the_client_and_a_reject_fails(docker_plane: Plane, session_id: str) -> None:
    async def reject(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        assert (request.permission, list(request.patterns)) == ("guarded", ["secret"])
        return tool_pb2.PermissionReply.REJECT, ""

    out = await docker_plane.client.execute_tool(session_id, "math_guarded", {}, on_permission=reject)
    assert out.error == "The user rejected permission to use this specific tool call."
    out = await docker_plane.client.execute_tool(session_id, "math_guarded", {}, on_permission=allow_once)
    assert out.output == "agent=build dir=/workspace"


async def test_python_tool(docker_plane: Plane, session_id: str) -> None:
    out = await docker_plane.client.execute_tool(session_id, "hello", {"name": "ada"})
    assert out.error is None
    assert out.output == f"hello ada from {session_id[:4]}"
