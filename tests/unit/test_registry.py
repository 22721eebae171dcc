"""Registry order, flags, the per-model filter and collisions (opencode-tools.md §2, §14)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from controlplane.core.calls.tool import InitContext, ToolContext, ToolDefinition, ToolInfo, ToolResult, ToolSource
from controlplane.core.definitions.registry import (
    BUILTIN_ORDER,
    Flags,
    Registry,
    batch_tool_enabled,
    use_apply_patch,
)
from controlplane.errors import ConfigError


class NoArgs(BaseModel):
    pass


def tool(tool_id: str, source: ToolSource = ToolSource.BUILTIN, origin: str = "builtin") -> ToolInfo:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(title="", output=origin)

    async def init(ctx: InitContext) -> ToolDefinition:
        return ToolDefinition(f"{tool_id} for {ctx.agent}", NoArgs, execute)

    return ToolInfo(id=tool_id, init=init, source=source, origin=origin)


ALL_BUILTINS = {i: tool(i) for i in (*BUILTIN_ORDER, "list", "multiedit")}
IMPLEMENTED = {i: tool(i) for i in ("read", "apply_patch", "invalid", "grep", "bash", "write", "glob", "edit")}
NO_FLAGS = {"OPENCODE_CLIENT": "server"}


def ids(tools: list[ToolInfo]) -> list[str]:
    return [t.id for t in tools]


def origin(registry: Registry, tool_id: str) -> str:
    found = registry.get(tool_id)
    assert found is not None
    return found.origin


def test_canonical_order_with_missing_builtins_skipped() -> None:
    registry = Registry(IMPLEMENTED)
    assert registry.ids() == ["invalid", "bash", "read", "glob", "grep", "edit", "write", "apply_patch"]


def test_default_env_full_order() -> None:
    # The default client is "cli", which enables the question tool; experimental tools stay off.
    assert Registry(ALL_BUILTINS, env={}).ids() == [
        "invalid", "question", "bash", "read", "glob", "grep", "edit", "write", "task", "webfetch", "todowrite",
        "websearch", "codesearch", "skill", "apply_patch",
    ]


def test_everything_enabled() -> None:
    env = {"OPENCODE_EXPERIMENTAL": "1"}
    registry = Registry(ALL_BUILTINS, env=env, config={"experimental": {"batch_tool": True}},
                        extra=["multiedit", "list"])
    assert registry.ids() == [*BUILTIN_ORDER, "list", "multiedit"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, True),
        ({"OPENCODE_CLIENT": "app"}, True),
        ({"OPENCODE_CLIENT": "desktop"}, True),
        ({"OPENCODE_CLIENT": "server"}, False),
        ({"OPENCODE_CLIENT": ""}, False),  # set but empty: not defaulted to cli
        ({"OPENCODE_CLIENT": "CLI"}, False),
        ({"OPENCODE_CLIENT": "server", "OPENCODE_ENABLE_QUESTION_TOOL": "TRUE"}, True),
        ({"OPENCODE_CLIENT": "server", "OPENCODE_ENABLE_QUESTION_TOOL": "yes"}, False),
    ],
)
def test_question_flag(env: dict[str, str], expected: bool) -> None:
    assert ("question" in Registry(ALL_BUILTINS, env=env).ids()) is expected


@pytest.mark.parametrize(
    ("env", "lsp", "plan_exit"),
    [
        (NO_FLAGS, False, False),
        ({"OPENCODE_EXPERIMENTAL_LSP_TOOL": "true"}, True, False),
        ({"OPENCODE_EXPERIMENTAL_LSP_TOOL": "0"}, False, False),
        ({"OPENCODE_EXPERIMENTAL_PLAN_MODE": "1"}, False, True),
        ({"OPENCODE_EXPERIMENTAL_PLAN_MODE": "1", "OPENCODE_CLIENT": "app"}, False, False),  # cli only
        ({"OPENCODE_EXPERIMENTAL": "True"}, True, True),
        ({"OPENCODE_EXPERIMENTAL": "True", "OPENCODE_CLIENT": "desktop"}, True, False),
    ],
)
def test_experimental_flags(env: dict[str, str], lsp: bool, plan_exit: bool) -> None:
    got = Registry(ALL_BUILTINS, env=env).ids()
    assert ("lsp" in got, "plan_exit" in got) == (lsp, plan_exit)
    if lsp:
        assert got.index("lsp") == got.index("apply_patch") + 1


def test_flags_from_env() -> None:
    assert Flags.from_env({}) == Flags()
    assert Flags.from_env({"OPENCODE_EXPERIMENTAL_EXA": "1"}).exa is True
    assert Flags.from_env({"OPENCODE_ENABLE_EXA": "true"}).exa is True
    assert Flags.from_env({"OPENCODE_EXPERIMENTAL": "1"}) == Flags(lsp_tool=True, plan_mode=True, exa=True)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, False),
        ({}, False),
        ({"experimental": {"batch_tool": True}}, True),
        ({"experimental": {"batch_tool": "true"}}, False),
        ({"experimental": {"batch_tool": 1}}, False),
        ({"experimental": None}, False),
    ],
)
def test_batch_tool_config(config: dict[str, Any] | None, expected: bool) -> None:
    assert batch_tool_enabled(config) is expected
    assert ("batch" in Registry(ALL_BUILTINS, config=config).ids()) is expected


def test_list_and_multiedit_are_not_registered_by_default() -> None:
    registry = Registry(ALL_BUILTINS)
    assert "list" not in registry.ids()
    assert "multiedit" not in registry.ids()
    assert registry.get("list") is None
    registry = Registry(ALL_BUILTINS, extra=["list"])
    assert registry.ids()[-1] == "list"
    assert registry.get("list") is ALL_BUILTINS["list"]


def test_rejects_unknown_builtins_and_extras() -> None:
    with pytest.raises(ConfigError):
        Registry({"frobnicate": tool("frobnicate")})
    with pytest.raises(ConfigError):
        Registry(ALL_BUILTINS, extra=["bash"])
    with pytest.raises(ConfigError):
        Registry({}).register(tool("frobnicate"))


# --- per-model filter ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "patch"),
    [
        ("gpt-5", True),
        ("gpt-5.1-codex", True),
        ("openai/gpt-5-mini", True),
        ("gpt-4o", False),
        ("gpt-4.1", False),
        ("gpt-oss-120b", False),
        ("openai/gpt-oss-20b", False),
        ("claude-sonnet-4-5", False),
        ("gpt5", False),
        ("o3", False),
    ],
)
def test_model_filter_matrix(model_id: str, patch: bool) -> None:
    assert use_apply_patch(model_id) is patch
    got = ids(Registry(IMPLEMENTED).tools("anthropic", model_id))
    if patch:
        assert got == ["invalid", "bash", "read", "glob", "grep", "apply_patch"]
    else:
        assert got == ["invalid", "bash", "read", "glob", "grep", "edit", "write"]


@pytest.mark.parametrize(
    ("provider", "env", "kept"),
    [
        ("anthropic", NO_FLAGS, False),
        ("opencode", NO_FLAGS, True),
        ("anthropic", {"OPENCODE_ENABLE_EXA": "1"}, True),
        ("anthropic", {"OPENCODE_EXPERIMENTAL_EXA": "true"}, True),
        ("anthropic", {"OPENCODE_EXPERIMENTAL": "1"}, True),
    ],
)
def test_exa_tools_gating(provider: str, env: dict[str, str], kept: bool) -> None:
    got = ids(Registry(ALL_BUILTINS, env=env).tools(provider, "claude"))
    assert ("websearch" in got, "codesearch" in got) == (kept, kept)
    assert "webfetch" in got


# --- custom / plugin / MCP and collisions --------------------------------------------------------


def test_sources_are_grouped_in_order() -> None:
    registry = Registry(IMPLEMENTED)
    registry.register(tool("srv_q", ToolSource.MCP, "mcp"))
    registry.register(tool("plug", ToolSource.PLUGIN, "plugin"))
    registry.register(tool("hello", ToolSource.CUSTOM, "custom"))
    registry.register(tool("math_add", ToolSource.CUSTOM, "custom"))
    assert registry.ids()[-4:] == ["hello", "math_add", "plug", "srv_q"]


def test_register_replaces_by_id_within_its_group() -> None:
    registry = Registry(IMPLEMENTED)
    registry.register(tool("a", ToolSource.CUSTOM, "one"))
    registry.register(tool("b", ToolSource.CUSTOM, "custom"))
    registry.register(tool("a", ToolSource.CUSTOM, "two"))
    assert registry.ids()[-2:] == ["a", "b"]
    assert origin(registry, "a") == "two"


def test_register_builtin_replaces_in_place() -> None:
    registry = Registry(IMPLEMENTED)
    replacement = tool("read", origin="patched")
    registry.register(replacement)
    assert registry.ids().index("read") == 2
    assert registry.get("read") is replacement
    registry.register(tool("webfetch"))
    assert registry.ids()[:8] == ["invalid", "bash", "read", "glob", "grep", "edit", "write", "webfetch"]


def test_collision_later_wins_at_first_position() -> None:
    registry = Registry(IMPLEMENTED)
    registry.register(tool("bash", ToolSource.CUSTOM, "custom"))
    registry.register(tool("extra", ToolSource.CUSTOM, "custom"))
    registry.register(tool("bash", ToolSource.PLUGIN, "plugin"))
    registry.register(tool("extra", ToolSource.MCP, "mcp"))
    # all()/ids() keep duplicates, like upstream's ids().
    assert registry.ids().count("bash") == 3
    offered = registry.tools("anthropic", "claude")
    assert ids(offered) == ["invalid", "bash", "read", "glob", "grep", "edit", "write", "extra"]
    by_id = {t.id: t.origin for t in offered}
    assert (by_id["bash"], by_id["extra"]) == ("plugin", "mcp")
    assert origin(registry, "bash") == "plugin"


def test_model_filter_is_by_id_and_drops_custom_edit_too() -> None:
    registry = Registry(IMPLEMENTED)
    registry.register(tool("edit", ToolSource.CUSTOM, "custom"))
    assert "edit" not in ids(registry.tools("openai", "gpt-5"))
    offered = registry.tools("anthropic", "claude")
    assert [t.origin for t in offered if t.id == "edit"] == ["custom"]
    assert ids(offered).index("edit") == 5


async def test_definitions_init_each_tool_for_the_agent() -> None:
    registry = Registry({"invalid": tool("invalid"), "bash": tool("bash")})
    defs = await registry.definitions("anthropic", "claude", "build")
    assert [(info.id, d.description) for info, d in defs] == [
        ("invalid", "invalid for build"), ("bash", "bash for build"),
    ]
