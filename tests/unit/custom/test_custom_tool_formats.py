"""controlplane.formats over the custom tools of tests/plugin_fixtures, their schemas as real Bun and zod give
them: every one valid in OpenAI's strict mode (tests/openai_strict_rules.py), in Gemini's subset, and kept as
is (less `$schema`) for Anthropic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from controlplane import formats
from controlplane.v1 import tool_pb2
from sandbox_agent.custom.host import ToolHost
from tests.openai_strict_rules import strict_violations
from tests.unit.custom.bun_host_parts import load
from tests.unit.custom.conftest import Sandbox
from tests.unit.test_formats import _gemini_problems

PATTERNS = Path(__file__).resolve().parents[2] / "plugin_fixtures" / "patterns"


async def test_every_fixture_tool_converts_for_each_provider(sandbox: Sandbox, bun_host: ToolHost) -> None:
    opencode = sandbox.project / ".opencode"
    shutil.copytree(PATTERNS / "tool", opencode / "tool", dirs_exist_ok=True)
    shutil.copytree(PATTERNS / "plugin", opencode / "plugin", dirs_exist_ok=True)
    shutil.copytree(PATTERNS / "deps", opencode / "node_modules")
    files = sorted(str(p) for p in (opencode / "tool").glob("*.ts"))
    plugins = tuple(sorted(str(p) for p in (opencode / "plugin").glob("*.[jt]s")))
    tools = await load(bun_host, sandbox, *files, plugins=plugins)
    assert len(tools) >= 10, [t.id for t in tools]
    listing = tool_pb2.ListToolsResponse(tools=[
        tool_pb2.ToolDefinition(id=t.id, description=t.description, parameters_json_schema=json.dumps(t.parameters))
        for t in tools
    ])
    raw_problems = [strict_violations({"type": "function", "function": {
        "name": t.id, "strict": True, "parameters": json.loads(t.parameters_json_schema)}}) for t in listing.tools]
    assert any(raw_problems), "the fixtures' raw schemas should need converting"
    for entry in formats.to_openai(listing, strict=True):
        assert strict_violations(entry) == [], (entry["function"]["name"], entry["function"]["parameters"])
    for declaration in formats.to_gemini(listing):
        if "parameters" in declaration:
            assert _gemini_problems(declaration["parameters"], declaration["name"]) == []
    for tool, entry in zip(listing.tools, formats.to_anthropic(listing), strict=True):
        expected = json.loads(tool.parameters_json_schema)
        expected.pop("$schema", None)
        assert entry["input_schema"] == formats.plain_schema(expected)
