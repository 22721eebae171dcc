"""webfetch, websearch and codesearch parameters: the JSON Schema and validation zod gives upstream.

The pinned schemas below are what zod's `toJSONSchema` printed for upstream's declarations; the live
test re-runs real zod (under the real Bun) on those declarations and on invalid arguments.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from controlplane.core.calls.tool import InitContext, ToolError
from controlplane.core.definitions.schema import parameters_schema
from controlplane.core.definitions.validation import validate
from controlplane.tools import codesearch, webfetch, websearch

ROOT = Path(__file__).resolve().parents[2]
DIALECT = "https://json-schema.org/draft/2020-12/schema"
MODELS: dict[str, type[BaseModel]] = {
    "webfetch": webfetch.WebFetchParams,
    "websearch": websearch.WebSearchParams,
    "codesearch": codesearch.CodeSearchParams,
}

GOLDEN: dict[str, dict[str, Any]] = {
    "webfetch": {
        "$schema": DIALECT,
        "type": "object",
        "properties": {
            "url": {"description": "The URL to fetch content from", "type": "string"},
            "format": {
                "description": "The format to return the content in (text, markdown, or html). Defaults to markdown.",
                "default": "markdown",
                "type": "string",
                "enum": ["text", "markdown", "html"],
            },
            "timeout": {"description": "Optional timeout in seconds (max 120)", "type": "number"},
        },
        "required": ["url", "format"],
        "additionalProperties": False,
    },
    "websearch": {
        "$schema": DIALECT,
        "type": "object",
        "properties": {
            "query": {"description": "Websearch query", "type": "string"},
            "numResults": {"description": "Number of search results to return (default: 8)", "type": "number"},
            "livecrawl": {
                "description": "Live crawl mode - 'fallback': use live crawling as backup if cached content "
                "unavailable, 'preferred': prioritize live crawling (default: 'fallback')",
                "type": "string",
                "enum": ["fallback", "preferred"],
            },
            "type": {
                "description": "Search type - 'auto': balanced search (default), 'fast': quick results, 'deep': "
                "comprehensive search",
                "type": "string",
                "enum": ["auto", "fast", "deep"],
            },
            "contextMaxCharacters": {
                "description": "Maximum characters for context string optimized for LLMs (default: 10000)",
                "type": "number",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    "codesearch": {
        "$schema": DIALECT,
        "type": "object",
        "properties": {
            "query": {
                "description": "Search query to find relevant context for APIs, Libraries, and SDKs. For example, "
                "'React useState hook examples', 'Python pandas dataframe filtering', 'Express.js middleware', "
                "'Next js partial prerendering configuration'",
                "type": "string",
            },
            "tokensNum": {
                "description": "Number of tokens to return (1000-50000). Default is 5000 tokens. Adjust this value "
                "based on how much context you need - use lower values for focused queries and higher values for "
                "comprehensive documentation.",
                "default": 5000,
                "type": "number",
                "minimum": 1000,
                "maximum": 50000,
            },
        },
        "required": ["query", "tokensNum"],
        "additionalProperties": False,
    },
}

# Upstream v1.2.27's declarations, for the live oracle (facts: the strings and the zod calls).
ZOD_SOURCE = r"""
import { z } from "zod"
const TOOLS = {
  webfetch: z.object({
    url: z.string().describe("The URL to fetch content from"),
    format: z.enum(["text", "markdown", "html"]).default("markdown")
      .describe("The format to return the content in (text, markdown, or html). Defaults to markdown."),
    timeout: z.number().describe("Optional timeout in seconds (max 120)").optional(),
  }),
  websearch: z.object({
    query: z.string().describe("Websearch query"),
    numResults: z.number().optional().describe("Number of search results to return (default: 8)"),
    livecrawl: z.enum(["fallback", "preferred"]).optional().describe(
      "Live crawl mode - 'fallback': use live crawling as backup if cached content unavailable, " +
      "'preferred': prioritize live crawling (default: 'fallback')"),
    type: z.enum(["auto", "fast", "deep"]).optional().describe(
      "Search type - 'auto': balanced search (default), 'fast': quick results, 'deep': comprehensive search"),
    contextMaxCharacters: z.number().optional().describe(
      "Maximum characters for context string optimized for LLMs (default: 10000)"),
  }),
  codesearch: z.object({
    query: z.string().describe(
      "Search query to find relevant context for APIs, Libraries, and SDKs. For example, " +
      "'React useState hook examples', 'Python pandas dataframe filtering', 'Express.js middleware', " +
      "'Next js partial prerendering configuration'"),
    tokensNum: z.number().min(1000).max(50000).default(5000).describe(
      "Number of tokens to return (1000-50000). Default is 5000 tokens. Adjust this value based on how much " +
      "context you need - use lower values for focused queries and higher values for comprehensive documentation."),
  }),
}
const cases = JSON.parse(process.argv[2])
const schemas = Object.fromEntries(Object.entries(TOOLS).map(([id, s]) => [id, z.toJSONSchema(s)]))
const results = cases.map(([tool, args]) => {
  const parsed = TOOLS[tool].safeParse(args)
  return parsed.success ? { data: parsed.data } : { error: String(parsed.error) }
})
process.stdout.write(JSON.stringify({ schemas, results }))
"""

CASES: list[tuple[str, dict[str, Any]]] = [
    ("webfetch", {"url": "https://example.com"}),
    ("webfetch", {}),
    ("webfetch", {"url": 5, "format": "pdf"}),
    ("webfetch", {"url": "https://example.com", "timeout": "30"}),
    ("websearch", {"query": "q", "type": "slow", "livecrawl": "always"}),
    ("websearch", {"query": "q", "numResults": "3", "extra": True}),
    ("websearch", {"query": None}),
    ("codesearch", {"query": "q"}),
    ("codesearch", {"query": "q", "tokensNum": 999}),
    ("codesearch", {"query": "q", "tokensNum": 50001}),
    ("codesearch", {"query": "q", "tokensNum": "5000"}),
]


def dumped(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False)


@pytest.mark.parametrize("tool_id", sorted(MODELS))
def test_schema_matches_upstream(tool_id: str) -> None:
    assert dumped(parameters_schema(MODELS[tool_id])) == dumped(GOLDEN[tool_id])


@pytest.mark.parametrize("tool_id", sorted(MODELS))
async def test_tool_modules_expose_their_definition(tool_id: str) -> None:
    module = {"webfetch": webfetch, "websearch": websearch, "codesearch": codesearch}[tool_id]
    info = module.TOOL
    assert info.id == tool_id
    first, second = await info.init(InitContext(agent="build")), await info.init(InitContext(agent="build"))
    assert first is not second
    assert first.parameters is MODELS[tool_id]
    assert first.description
    assert first.description == first.description.strip()
    assert "${" not in first.description


@pytest.mark.parametrize(
    ("tool_id", "phrases"),
    [
        ("webfetch", ["http://", "https://", '"markdown"', '"text"', '"html"', "30", "120", "5MB", "read-only",
                      "prefer", "loopback", "private", "metadata", "attachment"]),
        ("websearch", ["numResults", "8", '"fallback"', '"preferred"', '"auto"', '"fast"', '"deep"',
                       "contextMaxCharacters", "10000", "current year"]),
        ("codesearch", ["tokensNum", "1000", "50000", "5000", "libraries", "APIs"]),
    ],
)
async def test_descriptions_carry_the_rules(tool_id: str, phrases: list[str]) -> None:
    module = {"webfetch": webfetch, "websearch": websearch, "codesearch": codesearch}[tool_id]
    text = (await module.TOOL.init(InitContext(agent="build"))).description
    assert [p for p in phrases if p not in text] == []


def _bun() -> Path:
    cached = sorted(glob.glob(str(ROOT / "build" / "cache" / "bun-*" / "package" / "bin" / "bun")))
    candidates = [ROOT / "build" / "image" / "bun", *map(Path, cached)]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (staged by the build)")


def test_live_zod_agrees(tmp_path: Path) -> None:
    node_modules = ROOT / "build" / "image" / "node_modules"
    if not (node_modules / "zod").is_dir():
        pytest.fail(f"zod is missing from {node_modules} (the staged image inputs)")
    script = tmp_path / "web_oracle.mjs"
    script.write_text(ZOD_SOURCE, encoding="utf-8")
    proc = subprocess.run(
        [str(_bun()), str(script), json.dumps(CASES)], env={**os.environ, "NODE_PATH": str(node_modules)},
        capture_output=True, text=True, timeout=60, check=True,
    )
    oracle = json.loads(proc.stdout)
    assert dumped(oracle["schemas"]) == dumped(GOLDEN)
    for (tool_id, args), expected in zip(CASES, oracle["results"], strict=True):
        try:
            got: dict[str, Any] = {"data": validate(tool_id, MODELS[tool_id], args)}
        except ToolError as exc:
            got = {"error": str(exc)}
        if "error" in expected:
            expected = {"error": (
                f"The {tool_id} tool was called with invalid arguments: {expected['error']}.\n"
                "Please rewrite the input so it satisfies the expected schema."
            )}
        else:
            # Upstream strips undeclared keys; the platform keeps them (a documented divergence).
            declared = GOLDEN[tool_id]["properties"]
            got["data"] = {k: v for k, v in got["data"].items() if k in declared}
        assert got == expected, (tool_id, args)
