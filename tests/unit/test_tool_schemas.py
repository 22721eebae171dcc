"""Parameter schemas equal what zod 4.1.8's toJSONSchema gives for upstream's zod schemas.

The golden file comes from tests/unit/zod/generate.sh; when the real Bun is in build/image, the
oracle is re-run and must reproduce it.
"""

from __future__ import annotations

import importlib
import json
from importlib import resources
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from controlplane.core.calls.tool import InitContext, PermissionAsk, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.core.calls.truncation import MAX_BYTES, MAX_LINES
from controlplane.core.definitions.schema import parameters_schema
from tests.unit.zod.models import FEATURES
from tests.unit.zod.oracle import load_golden, oracle_available, run_oracle

TOOL_IDS = ["invalid", "bash", "read", "write", "edit", "multiedit", "apply_patch", "glob", "grep", "list"]
GOLDEN = load_golden()


def tool_info(tool_id: str) -> ToolInfo:
    info: ToolInfo = importlib.import_module(f"controlplane.tools.{tool_id}").TOOL
    return info


async def definition(tool_id: str) -> ToolDefinition:
    return await tool_info(tool_id).init(InitContext(agent="build"))


def dumped(value: Any) -> str:
    """JSON text with keys in insertion order: equal texts mean equal content and equal key order."""
    return json.dumps(value, indent=1, ensure_ascii=False)


@pytest.mark.parametrize("tool_id", TOOL_IDS)
async def test_tool_schema_matches_zod(tool_id: str) -> None:
    parameters = (await definition(tool_id)).parameters
    assert parameters is not None
    schema = parameters_schema(parameters)
    assert dumped(schema) == dumped(GOLDEN["schemas"][tool_id])


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_feature_schema_matches_zod(name: str) -> None:
    assert dumped(parameters_schema(FEATURES[name])) == dumped(GOLDEN["schemas"][name])


def test_golden_covers_every_tool_and_feature() -> None:
    assert set(GOLDEN["schemas"]) == set(TOOL_IDS) | set(FEATURES)


@pytest.mark.skipif(not oracle_available(), reason="build/image/bun (the real zod oracle) is not present")
def test_live_oracle_reproduces_golden() -> None:
    assert dumped(run_oracle()) == dumped(GOLDEN)


def test_schema_has_no_titles_and_no_refs() -> None:
    for model in [*(_model(t) for t in TOOL_IDS), *FEATURES.values()]:
        text = dumped(parameters_schema(model))
        assert '"title"' not in text
        assert "$defs" not in text
        assert "$ref" not in text


def _model(tool_id: str) -> type[BaseModel]:
    module = importlib.import_module(f"controlplane.tools.{tool_id}")
    models = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, BaseModel)
              and v.__module__ == module.__name__]
    assert len(models) == 1, models
    return models[0]


def test_required_and_optional_keys() -> None:
    schemas = {t: parameters_schema(_model(t)) for t in TOOL_IDS}
    assert schemas["bash"]["required"] == ["command", "description"]
    assert schemas["read"]["required"] == ["filePath"]
    assert schemas["edit"]["required"] == ["filePath", "oldString", "newString"]
    assert schemas["multiedit"]["properties"]["edits"]["items"]["required"] == ["filePath", "oldString", "newString"]
    assert "required" not in schemas["list"]  # zod omits an empty list
    assert schemas["glob"]["required"] == ["pattern"]
    assert schemas["grep"]["required"] == ["pattern"]


def test_parameters_schema_returns_a_fresh_dict() -> None:
    first = parameters_schema(FEATURES["feature_values"])
    first["properties"]["order"]["default"].append("mutated")
    first["required"].clear()
    assert parameters_schema(FEATURES["feature_values"]) == GOLDEN["schemas"]["feature_values"]


# --- the tool modules ---------------------------------------------------------------------------


@pytest.mark.parametrize("tool_id", TOOL_IDS)
async def test_tool_module_exposes_its_info(tool_id: str) -> None:
    info = tool_info(tool_id)
    assert info.id == tool_id
    first, second = await definition(tool_id), await definition(tool_id)
    assert first.parameters is _model(tool_id)
    assert first is not second  # a fresh definition per init (upstream's double-wrap quirk is not reproduced)
    assert first.description.strip() == first.description
    assert first.description
    assert "${" not in first.description


@pytest.mark.parametrize("tool_id", TOOL_IDS)
def test_description_file_is_package_data(tool_id: str) -> None:
    resource = resources.files("controlplane.tools").joinpath(f"{tool_id}.txt")
    assert resource.is_file()
    assert resource.read_text(encoding="utf-8").strip()


async def test_bash_description_fills_its_placeholders() -> None:
    raw = resources.files("controlplane.tools").joinpath("bash.txt").read_text(encoding="utf-8")
    for placeholder in ("${directory}", "${maxLines}", "${maxBytes}"):
        assert placeholder in raw
    text = (await definition("bash")).description
    assert "/workspace" in text
    assert str(MAX_LINES) in text
    assert str(MAX_BYTES) in text
    assert (MAX_LINES, MAX_BYTES) == (2000, 51200)


@pytest.mark.parametrize(
    ("tool_id", "phrases"),
    [
        ("bash", ["workdir", "&&", "HEREDOC", "git config", "-i", "--amend", "force push", "gh pr create", "Glob",
                  "Grep", "Read", "Edit", "Write", "120000", "quote"]),
        ("read", ["/workspace", "2000", "1: foo", "/", "parallel", "PDF", "Images"]),
        ("write", ["/workspace", "Read", "emoji", "README"]),
        ("edit", ["/workspace", "Read", "replaceAll", "indentation", "emoji"]),
        ("multiedit", ["/workspace", "atomic", "Read"]),
        ("apply_patch", ["*** Begin Patch", "*** End Patch", "*** Add File:", "*** Delete File:",
                         "*** Update File:", "*** Move to:", "@@", "*** End of File", "/workspace"]),
        ("glob", ["/workspace", "**/*.js", "modification time"]),
        ("grep", ["/workspace", "include", "modification time", "rg", "Task"]),
        ("list", ["/workspace", "ignore", "Glob", "Grep"]),
    ],
)
async def test_descriptions_carry_the_reference_rules(tool_id: str, phrases: list[str]) -> None:
    text = (await definition(tool_id)).description
    missing = [p for p in phrases if p not in text]
    assert missing == []


async def _never_ask(_: PermissionAsk) -> None:
    raise AssertionError("invalid asks nothing")


async def _no_metadata(_title: str | None, _metadata: dict[str, Any] | None) -> None:
    raise AssertionError("invalid streams nothing")


class _NoSandbox:
    async def run_builtin(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise AssertionError("invalid runs in the control plane")

    async def save_output(self, name: str, content: str) -> str:
        raise AssertionError("invalid saves nothing")

    async def run_custom(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise AssertionError("no custom tools here")

    async def plugin_hook(self, name: str, input_: dict[str, Any], output: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no project plugins here")


async def test_invalid_tool_echoes_the_error() -> None:
    ctx = ToolContext("ses", "msg", "call", "build", _never_ask, _no_metadata, _NoSandbox())
    d = await definition("invalid")
    assert d.description == "Do not use"
    result = await d.execute({"tool": "frobnicate", "error": "Model tried to call unavailable tool 'frobnicate'."}, ctx)
    assert result == ToolResult(
        title="Invalid Tool",
        output="The arguments provided to the tool are invalid: Model tried to call unavailable tool 'frobnicate'.",
        metadata={},
    )


async def test_sandboxed_tools_delegate_to_the_agent() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    class Sandbox(_NoSandbox):
        async def run_builtin(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            calls.append((tool, args))
            return ToolResult(title="t", output="o")

    ctx = ToolContext("ses", "msg", "call", "build", _never_ask, _no_metadata, Sandbox())
    for tool_id in TOOL_IDS[1:]:
        await (await definition(tool_id)).execute({"k": tool_id}, ctx)
    assert calls == [(t, {"k": t}) for t in TOOL_IDS[1:]]


# --- what the mapping refuses -------------------------------------------------------------------


class _Tuple(BaseModel):
    pair: tuple[str, str]


class _IntKeys(BaseModel):
    table: dict[int, str]


class _Pattern(BaseModel):
    name: str = Field(pattern="^a")


class _Node(BaseModel):
    children: list[_Node] = Field(default_factory=list)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    a: str


@pytest.mark.parametrize("model", [_Tuple, _IntKeys, _Pattern, _Node])
def test_unsupported_models_are_refused(model: type[BaseModel]) -> None:
    with pytest.raises(TypeError):
        parameters_schema(model)


def test_strict_top_level_object() -> None:
    assert parameters_schema(_Strict) == {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
