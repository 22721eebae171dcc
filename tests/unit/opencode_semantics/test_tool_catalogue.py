"""The built-in tool catalogue is what each side loads: no tool module without an entry, no entry without its
modules, on the control plane's side and the sandbox agent's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from controlplane.core.definitions.registry import BUILTIN_ORDER, EXTRA_ORDER
from controlplane.tools import catalog
from opencode_semantics.tools import BUILTIN_TOOLS, BY_ID, SANDBOX_IDS
from sandbox_agent.tool_calls import load_tool
from sandbox_agent.tools.base import ToolError

ROOT = Path(__file__).resolve().parents[3]
CP_TOOLS = ROOT / "controlplane" / "tools"
AGENT_TOOLS = ROOT / "sandbox-image" / "sandbox_agent" / "tools"
IDS = [tool.id for tool in BUILTIN_TOOLS]


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_ids_are_unique_and_in_the_registry_order() -> None:
    assert len(set(IDS)) == len(IDS)
    assert list(BUILTIN_ORDER) + list(EXTRA_ORDER) == IDS
    assert BY_ID["bash"].runs_in == "sandbox"
    assert BY_ID["task"].runs_in == "control_plane"


def test_the_control_plane_has_a_tool_module_and_description_for_exactly_the_catalogued_ids() -> None:
    defining = {p.stem for p in CP_TOOLS.glob("*.py") if _top_level_names(p) & {"TOOL", "make_tool"}}
    assert defining == {tool.module for tool in BUILTIN_TOOLS}
    assert {p.stem for p in CP_TOOLS.glob("*.txt")} == {tool.module for tool in BUILTIN_TOOLS}


def test_the_agent_has_a_run_module_for_exactly_the_sandbox_ids() -> None:
    running = {p.stem for p in AGENT_TOOLS.glob("*.py") if "run" in _top_level_names(p)}
    assert running == {BY_ID[i].module for i in SANDBOX_IDS}
    assert SANDBOX_IDS == {"bash", "read", "write", "edit", "multiedit", "apply_patch", "glob", "grep", "list",
                           "skill", "lsp"}


def test_each_side_loads_its_modules_from_the_catalogue() -> None:
    tools = catalog.implemented()
    assert set(tools) == set(IDS)
    assert all(info.id == tool_id for tool_id, info in tools.items())
    for tool_id in SANDBOX_IDS:
        assert callable(load_tool(tool_id))
    for tool_id in set(IDS) - SANDBOX_IDS:
        with pytest.raises(ToolError, match="the sandbox has no built-in tool named"):
            load_tool(tool_id)
