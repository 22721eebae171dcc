"""Control-plane tool schemas against the real zod, batch's validation text and the registry's
per-session `batch` flag."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.calls.tool import InitContext, ToolError
from controlplane.core.definitions.registry import Registry
from controlplane.core.definitions.validation import validate
from controlplane.tools import batch, catalog, plan_exit, question, todoread, todowrite

ROOT = Path(__file__).resolve().parents[3]
ZOD_SCHEMAS = r"""
import { z } from "zod"
const Option = z.object({
  label: z.string().describe("Display text (1-5 words, concise)"),
  description: z.string().describe("Explanation of choice"),
}).meta({ ref: "QuestionOption" })
const Info = z.object({
  question: z.string().describe("Complete question"),
  header: z.string().describe("Very short label (max 30 chars)"),
  options: z.array(Option).describe("Available choices"),
  multiple: z.boolean().optional().describe("Allow selecting multiple choices"),
  custom: z.boolean().optional().describe("Allow typing a custom answer (default: true)"),
}).meta({ ref: "QuestionInfo" })
const Todo = z.object({
  content: z.string().describe("Brief description of the task"),
  status: z.string().describe("Current status of the task: pending, in_progress, completed, cancelled"),
  priority: z.string().describe("Priority level of the task: high, medium, low"),
}).meta({ ref: "Todo" })
const tools = {
  question: z.object({ questions: z.array(Info.omit({ custom: true })).describe("Questions to ask") }),
  todowrite: z.object({ todos: z.array(z.object(Todo.shape)).describe("The updated todo list") }),
  todoread: z.object({}),
  plan_exit: z.object({}),
  batch: z.object({
    tool_calls: z.array(z.object({
      tool: z.string().describe("The name of the tool to execute"),
      parameters: z.object({}).loose().describe("Parameters for the tool"),
    })).min(1, "Provide at least one tool call").describe("Array of tool calls to execute in parallel"),
  }),
}
const out = {}
for (const [id, schema] of Object.entries(tools)) out[id] = z.toJSONSchema(schema)
console.log(JSON.stringify(out))
"""
MODULES = {"question": question, "todowrite": todowrite, "todoread": todoread, "plan_exit": plan_exit, "batch": batch}


def bun() -> Path:
    found = [ROOT / "build/image/bun", *sorted(ROOT.glob("build/cache/bun-*/package/bin/bun"))]
    for path in found:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (run `make image`)")


def zod_schemas(tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "schemas.mjs"
    script.write_text(ZOD_SCHEMAS)
    env = {**os.environ, "NODE_PATH": str(ROOT / "build/image/node_modules")}
    done = subprocess.run([str(bun()), str(script)], env=env, capture_output=True, text=True, timeout=60, check=True)
    schemas: dict[str, Any] = json.loads(done.stdout)
    return schemas


async def test_schemas_equal_zods(tmp_path: Path) -> None:
    expected = zod_schemas(tmp_path)
    for tool_id, module in MODULES.items():
        schema = (await module.TOOL.init(InitContext(agent="build"))).schema()
        assert json.dumps(schema, indent=1) == json.dumps(expected[tool_id], indent=1), tool_id


def batch_error(args: Any) -> str:
    with pytest.raises(ToolError) as err:
        validate("batch", batch.BatchParams, args, batch.format_validation_error)
    return str(err.value)


def test_validation_message_lists_every_issue_with_its_path() -> None:
    tail = '\n\nExpected payload format:\n  [{"tool": "tool_name", "parameters": {...}}, {...}]'
    assert batch_error({"tool_calls": []}) == (
        "Invalid parameters for tool 'batch':\n  - tool_calls: Provide at least one tool call" + tail
    )
    assert batch_error({"tool_calls": [{"tool": "read", "parameters": {}}, {"parameters": 3}]}) == (
        "Invalid parameters for tool 'batch':\n"
        "  - tool_calls.1.tool: Invalid input: expected string, received undefined\n"
        "  - tool_calls.1.parameters: Invalid input: expected object, received number" + tail
    )
    parsed = validate("batch", batch.BatchParams, {"tool_calls": [{"tool": "read", "parameters": {"filePath": "/a"}}]})
    assert parsed == {"tool_calls": [{"tool": "read", "parameters": {"filePath": "/a"}}]}


def test_refusal_texts() -> None:
    assert batch.disallowed_message("batch") == "Tool 'batch' is not allowed in batch. Disallowed tools: batch"
    assert batch.not_in_registry_message("x", ["invalid", "bash", "apply_patch", "batch", "read"]) == (
        "Tool 'x' not in registry. External tools (MCP, environment) cannot be batched - call them directly."
        " Available tools: bash, read"
    )


def test_batch_follows_the_session_config_and_todoread_stays_unlisted() -> None:
    tools = catalog.implemented()
    registry = Registry(catalog.registered(tools), env={})
    assert "batch" not in registry.ids()
    flagged = registry.for_session({"experimental": {"batch_tool": True}})
    assert flagged.ids()[-1] == "batch"
    assert registry.for_session({"experimental": {"batch_tool": "true"}}) is registry  # exactly `true` only
    assert "batch" not in registry.ids()  # the shared registry is unchanged
    assert "todoread" not in flagged.ids()
    assert set(catalog.unregistered(tools)) == {"list", "multiedit", "todoread"}
    planning = Registry(catalog.registered(tools), env={"OPENCODE_EXPERIMENTAL_PLAN_MODE": "true"})
    assert planning.ids()[-1] == "plan_exit"
    assert "plan_exit" not in Registry(catalog.registered(tools), env={
        "OPENCODE_EXPERIMENTAL_PLAN_MODE": "1", "OPENCODE_CLIENT": "app"}).ids()
    assert "question" not in Registry(catalog.registered(tools), env={"OPENCODE_CLIENT": "web"}).ids()
