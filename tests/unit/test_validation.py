"""Argument validation gives zod 4.1.8's result: the same parsed data, or the same error text.

Expected messages come from tests/unit/zod/golden.json (real zod, via generate.sh); with the real
Bun present, a seeded batch of generated arguments is also checked against zod live.
"""

from __future__ import annotations

import copy
import importlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from controlplane.core.calls.tool import ToolError
from controlplane.core.definitions.validation import validate
from opencode_semantics.javascript import json_stringify
from tests.unit.zod.models import FEATURES
from tests.unit.zod.oracle import load_cases, load_golden, oracle_available, run_oracle

TOOL_IDS = ["invalid", "bash", "read", "write", "edit", "multiedit", "apply_patch", "glob", "grep", "list"]
CASES = load_cases()
GOLDEN = load_golden()


def model_for(name: str) -> type[BaseModel]:
    if name in FEATURES:
        return FEATURES[name]
    module = importlib.import_module(f"controlplane.tools.{name}")
    models = [v for v in vars(module).values()
              if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == module.__name__]
    assert len(models) == 1
    return models[0]


def declared_keys(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def expected_error(tool: str, zod_error: str) -> str:
    return (
        f"The {tool} tool was called with invalid arguments: {zod_error}.\n"
        "Please rewrite the input so it satisfies the expected schema."
    )


def check_against_zod(tool: str, args: Any, zod: dict[str, Any]) -> None:
    """`validate` agrees with one zod result (`error` text, or parsed `data`)."""
    model = model_for(tool)
    before = copy.deepcopy(args)
    if "error" in zod:
        with pytest.raises(ToolError) as caught:
            validate(tool, model, args)
        assert str(caught.value) == expected_error(tool, zod["error"])
    else:
        result = validate(tool, model, args)
        keys = declared_keys(model)
        # zod's z.object strips undeclared keys; the platform keeps them as given.
        assert {k: v for k, v in result.items() if k in keys} == zod["data"]
        assert {k: v for k, v in result.items() if k not in keys} == {k: v for k, v in args.items() if k not in keys}
    assert args == before  # the caller's arguments are never mutated


def test_cases_and_golden_line_up() -> None:
    assert [c["tool"] for c in CASES] == [c["tool"] for c in GOLDEN["cases"]]
    assert {c["tool"] for c in CASES} == set(TOOL_IDS) | set(FEATURES)
    assert sum("error" in c for c in GOLDEN["cases"]) > 50


@pytest.mark.parametrize(
    ("case", "zod"), list(zip(CASES, GOLDEN["cases"], strict=True)), ids=lambda c: str(c.get("tool", ""))
)
def test_case_matches_zod(case: dict[str, Any], zod: dict[str, Any]) -> None:
    check_against_zod(case["tool"], case["args"], zod)


# --- details worth pinning down without the golden file -----------------------------------------


def test_read_message_exactly() -> None:
    with pytest.raises(ToolError) as caught:
        validate("read", model_for("read"), {"offset": "abc"})
    assert str(caught.value) == (
        "The read tool was called with invalid arguments: [\n"
        "  {\n"
        '    "expected": "string",\n'
        '    "code": "invalid_type",\n'
        '    "path": [\n'
        '      "filePath"\n'
        "    ],\n"
        '    "message": "Invalid input: expected string, received undefined"\n'
        "  },\n"
        "  {\n"
        '    "expected": "number",\n'
        '    "code": "invalid_type",\n'
        '    "received": "NaN",\n'
        '    "path": [\n'
        '      "offset"\n'
        "    ],\n"
        '    "message": "Invalid input: expected number, received NaN"\n'
        "  }\n"
        "].\n"
        "Please rewrite the input so it satisfies the expected schema."
    )


def test_valid_arguments_get_defaults_and_coercions_and_keep_extras() -> None:
    args = {"filePath": "/w/a.py", "offset": "10", "limit": " 5 ", "bogus": {"kept": True}}
    assert validate("read", model_for("read"), args) == {
        "filePath": "/w/a.py", "offset": 10, "limit": 5, "bogus": {"kept": True},
    }
    values = validate("feature_values", FEATURES["feature_values"], {"kind": "only"})
    assert values == {"mode": "markdown", "kind": "only", "flag": False, "order": ["a"]}
    values["order"].append("b")  # defaults are copies, not shared state
    assert validate("feature_values", FEATURES["feature_values"], {"kind": "only"})["order"] == ["a"]


def test_optional_keys_stay_absent() -> None:
    assert validate("bash", model_for("bash"), {"command": "ls", "description": "Lists files"}) == {
        "command": "ls", "description": "Lists files",
    }


def test_integral_float_for_int_becomes_int() -> None:
    result = validate("feature_numbers", FEATURES["feature_numbers"], {"level": 3.0, "count": -2.0})
    assert result == {"level": 3, "count": -2}
    assert all(type(v) is int for v in result.values())


def test_integers_past_the_safe_range_become_doubles() -> None:
    """JSON.parse gives upstream doubles, so 2**53 + 1 reaches a tool (and its echo) as 2**53."""
    args = {"command": "x", "description": "d", "timeout": -(2**53 + 1), "extra": [12345678901234567890, 10**400]}
    result = validate("bash", model_for("bash"), args)
    assert result["timeout"] == -(2**53)
    assert type(result["timeout"]) is float
    # Infinity is null in JSON
    assert json_stringify(result["extra"], indent=2) == "[\n  12345678901234567000,\n  null\n]"


@pytest.mark.parametrize("args", [None, [], "x", 3, True])
def test_non_object_arguments(args: Any) -> None:
    with pytest.raises(ToolError) as caught:
        validate("glob", model_for("glob"), args)
    kind = {type(None): "null", list: "array", str: "string", int: "number", bool: "boolean"}[type(args)]
    assert str(caught.value) == expected_error(
        "glob",
        "[\n  {\n"
        '    "expected": "object",\n    "code": "invalid_type",\n    "path": [],\n'
        f'    "message": "Invalid input: expected object, received {kind}"\n'
        "  }\n]",
    )


def test_format_validation_error_replaces_the_message() -> None:
    seen: list[ValidationError] = []

    def fmt(error: ValidationError) -> str:
        seen.append(error)
        return "custom: " + "; ".join(f"{e['type']}@{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())

    args = {"filePath": "/a", "edits": [{"filePath": "/a", "oldString": 1, "newString": "y"}, "x"]}
    with pytest.raises(ToolError) as caught:
        validate("multiedit", model_for("multiedit"), args, fmt)
    assert str(caught.value) == (
        "custom: invalid_type@edits.0.oldString: Invalid input: expected string, received number; "
        "invalid_type@edits.1: Invalid input: expected object, received string"
    )
    assert [e["input"] for e in seen[0].errors()] == [1, "x"]


def test_format_validation_error_keeps_braces() -> None:
    with pytest.raises(ToolError) as caught:
        validate("feature_nesting", FEATURES["feature_nesting"],
                 {"name": "ok", "items": [{"name": "a", "{x}": 1}]}, lambda e: e.errors()[0]["msg"])
    assert str(caught.value) == 'Unrecognized key: "{x}"'


# --- live comparison with zod on generated arguments ---------------------------------------------


SAMPLES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 3, 5, 7, 0.5, 1.5, -2.5, 2**53, 1e22, "", "a", "ab", "abcd", "markdown", "pdf",
    "only", "x", "5", " 3 ", "abc", "0x10", "Infinity", "😀", [], [1], ["a"], ["", "a", 3], [{}], {}, {"name": "a"},
    {"filePath": "/a", "oldString": "x", "newString": "y"}, {"key": "k", "z": 1}, {"a": 1, "b": "2"},
    [{"name": "a", "count": 1}], [{"name": "", "x": 1}, 3], [{"filePath": "/a", "oldString": "", "newString": 2}],
]


def _random_args(rng: random.Random, model: type[BaseModel]) -> dict[str, Any]:
    keys = sorted(declared_keys(model))
    args: dict[str, Any] = {}
    for key in keys:
        if rng.random() < 0.75:
            args[key] = copy.deepcopy(rng.choice(SAMPLES))
    if rng.random() < 0.2:
        args["undeclared"] = rng.choice(SAMPLES)
    return args


@pytest.mark.skipif(not oracle_available(), reason="build/image/bun (the real zod oracle) is not present")
def test_generated_arguments_match_live_zod(tmp_path: Path) -> None:
    rng = random.Random(20260316)
    names = [*TOOL_IDS, *sorted(FEATURES)]
    cases: list[dict[str, Any]] = [
        {"tool": name, "args": _random_args(rng, model_for(name))} for name in names for _ in range(60)
    ]
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    zod = run_oracle(cases_file)["cases"]
    assert len(zod) == len(cases)
    for case, result in zip(cases, zod, strict=True):
        check_against_zod(case["tool"], case["args"], result)
