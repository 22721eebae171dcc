"""The workspace narrows the caller's rules, never widens them (controlplane.core.permissions.rule_layers).

Each case builds a session's config the way CreateSession does (project_files.session_and_caller_config
from the archive's config files and the caller's `config_json`), its agents and session rules as the tool
runtime does (rule_layers), and asks the real permission gate for a decision, with the operator's rules
after everything. The sandbox agent's local matcher is held to the same decisions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from controlplane.core.calls.tool import PermissionAsk
from controlplane.core.config import project_files
from controlplane.core.permissions import rule_layers
from controlplane.core.permissions.asks import AskScope, PermissionGate, _snapshot
from controlplane.core.permissions.permission import Agent, DeniedError, Rule, Ruleset, from_config
from controlplane.sandbox.rule_encoding import encode_rules
from sandbox_agent.permission_rules import LocalRules

HOME = "/home/tool"
SETTING = rule_layers.AgentSetting(f"{HOME}/.local/share/opencode/tool-output", f"{HOME}/.local/share/opencode/plans",
                                   HOME)
MD_BASH_ALLOW = "---\ndescription: Markdown agent\nmode: subagent\npermission:\n  bash: allow\n---\nDo it.\n"


@dataclass(frozen=True)
class Case:
    name: str
    caller: dict[str, Any]
    files: dict[str, str]
    agent: str
    permission: str
    pattern: str
    expected: str
    child: bool = False
    operator: dict[str, Any] = field(default_factory=dict)
    upstream: str = ""
    """What upstream's merge order alone decides (when it differs: the widening this layer stops)."""


def opencode(config: Mapping[str, Any]) -> str:
    return json.dumps(config)


CASES = [
    Case("finding 8: task child of a workspace markdown agent", {"permission": {"bash": "deny"}},
         {".opencode/agent/md.md": MD_BASH_ALLOW}, "md", "bash", "touch pwned", "deny", child=True,
         upstream="allow"),
    Case("workspace markdown agent in .opencode/agents/ subdir", {"permission": {"bash": "deny"}},
         {".opencode/agents/team/md.md": MD_BASH_ALLOW}, "team/md", "bash", "ls", "deny", upstream="allow"),
    Case("workspace opencode.json top-level pattern allow under caller ask", {"permission": {"bash": {"*": "ask"}}},
         {"opencode.json": opencode({"permission": {"bash": {"*": "ask", "git *": "allow"}}})}, "build",
         "bash", "git status", "ask", upstream="allow"),
    Case("workspace .opencode/opencode.jsonc top-level allow vs caller ask", {"permission": {"edit": "ask"}},
         {".opencode/opencode.jsonc": "// c\n" + opencode({"agent": {"build": {"permission": {"edit": "allow"}}}})},
         "build", "edit", "src/a.py", "ask", upstream="allow"),
    Case("workspace agent permission as a bare string", {"permission": {"bash": "ask"}},
         {"opencode.json": opencode({"agent": {"build": {"permission": "allow"}}})}, "build", "bash", "ls", "ask",
         upstream="allow"),
    Case("frontmatter legacy tools: {bash: true}", {"permission": {"bash": "deny"}},
         {".opencode/agent/md.md": "---\nmode: subagent\ntools:\n  bash: true\n---\nx\n"}, "md", "bash", "ls",
         "deny", child=True, upstream="allow"),
    Case("legacy tools map of an agent in opencode.json", {"permission": {"bash": "deny"}},
         {"opencode.json": opencode({"agent": {"general": {"tools": {"bash": True}}}})}, "general", "bash", "ls",
         "deny", child=True, upstream="allow"),
    Case("workspace overrides built-in build", {"permission": {"bash": "deny"}},
         {"opencode.json": opencode({"agent": {"build": {"permission": {"bash": "allow"}}}})}, "build", "bash",
         "ls", "deny", upstream="allow"),
    Case("workspace overrides built-in explore (edit denied by its defaults)", {},
         {"opencode.json": opencode({"agent": {"explore": {"permission": {"edit": "allow"}}}})}, "explore",
         "edit", "a.txt", "deny", child=True, upstream="allow"),
    Case("workspace mode file (primary agent)", {"permission": {"webfetch": "deny"}},
         {".opencode/mode/m.md": "---\npermission:\n  webfetch: allow\n---\nx\n"}, "m", "webfetch",
         "https://example.invalid", "deny", upstream="allow"),
    Case("workspace default_agent picks its own agent", {"permission": {"bash": "deny"}},
         {"opencode.json": opencode({"default_agent": "own",
                                     "agent": {"own": {"mode": "primary", "permission": {"bash": "allow"}}}})},
         "<default>", "bash", "ls", "deny", upstream="allow"),
    Case("workspace experimental.primary_tools allows in task children", {"permission": {"bash": "deny"}},
         {"opencode.json": opencode({"experimental": {"primary_tools": ["bash"]}})}, "general", "bash", "ls",
         "deny", child=True, upstream="allow"),
    Case("grandchild: the workspace agent lets children start tasks", {"permission": {"bash": "deny"}},
         {".opencode/agent/md.md": "---\nmode: subagent\npermission:\n  task: allow\n  bash: allow\n---\nx\n"},
         "md", "task", "md", "deny", child=True, upstream="allow"),
    Case("grandchild of a caller that allows task: bash still denied",
         {"permission": {"bash": "deny", "task": "allow"}},
         {".opencode/agent/md.md": "---\nmode: subagent\npermission:\n  task: allow\n  bash: allow\n---\nx\n"},
         "md", "bash", "ls", "deny", child=True, upstream="allow"),
    Case("defaults count too: .env reads ask", {},
         {"opencode.json": opencode({"permission": {"read": {"*.env": "allow"}}})}, "build",
         "read", "/workspace/.env", "ask", upstream="allow"),
    Case("defaults count too: external_directory asks", {},
         {"opencode.json": opencode({"permission": {"external_directory": {"/etc/*": "allow"}}})}, "build",
         "external_directory", "/etc/passwd", "ask", upstream="allow"),
    Case("defaults count too: doom_loop asks", {}, {"opencode.json": opencode({"permission": {"doom_loop": "allow"}})},
         "build", "doom_loop", "bash", "ask", upstream="allow"),
    Case("operator tenant deny stays over a workspace agent allow", {},
         {".opencode/agent/md.md": "---\nmode: subagent\npermission:\n  bash:\n    'rm *': allow\n---\nx\n"}, "md",
         "bash", "rm -rf x", "deny", child=True, operator={"bash": {"rm *": "deny"}}, upstream="deny"),
    Case("operator ask stays over a workspace allow", {},
         {"opencode.json": opencode({"permission": {"bash": {"curl *": "allow"}}})}, "build", "bash",
         "curl x", "ask", operator={"bash": {"curl *": "ask"}}, upstream="ask"),
    # Narrowing keeps working.
    Case("narrowing: workspace deny where the caller's rules allow", {"permission": {"edit": "allow"}},
         {"opencode.json": opencode({"permission": {"bash": {"*": "allow", "rm *": "deny"}}})}, "build", "bash",
         "rm -rf /", "deny", upstream="deny"),
    Case("narrowing keeps what it does not touch", {"permission": {"edit": "allow"}},
         {"opencode.json": opencode({"permission": {"bash": {"*": "allow", "rm *": "deny"}}})}, "build", "bash",
         "ls -la", "allow", upstream="allow"),
    Case("narrowing: workspace agent asks where caller allows", {"permission": {"bash": "allow"}},
         {".opencode/agent/md.md": "---\nmode: subagent\npermission:\n  bash: ask\n---\nx\n"}, "md", "bash", "ls",
         "ask", child=True, upstream="ask"),
    Case("a workspace-only agent keeps the caller's allows", {"permission": {"edit": "allow"}},
         {".opencode/agent/md.md": MD_BASH_ALLOW}, "md", "edit", "a.txt", "allow", child=True, upstream="allow"),
    Case("a workspace-only subagent is capped by the caller's rules for the session's agent",
         {"agent": {"build": {"permission": {"bash": "deny"}}, "general": {"disable": True},
                    "explore": {"disable": True}}},
         {".opencode/agent/md.md": "---\nmode: subagent\n---\nx\n"}, "md", "bash", "rm f", "deny", child=True,
         upstream="allow"),
    Case("caller's own agent section still applies", {"agent": {"md": {"permission": {"bash": "allow"}}}},
         {".opencode/agent/md.md": "---\nmode: subagent\n---\nx\n"}, "md", "bash", "ls", "allow", child=True,
         upstream="allow"),
    Case("no workspace config: upstream's merge unchanged", {"permission": {"bash": "deny"},
                                                             "agent": {"md": {"permission": {"bash": "allow"}}}},
         {}, "md", "bash", "ls", "allow", upstream="allow"),
]


def session_of(case: Case) -> tuple[str, Ruleset, Ruleset | None, set[str]]:
    files = {path: text.encode() for path, text in case.files.items()}
    merged, caller = project_files.session_and_caller_config(files, json.dumps(case.caller) if case.caller else "")
    config = json.loads(merged) if merged else {}
    caller_config = None if caller is None else (json.loads(caller) if caller else {})
    agents = rule_layers.session_agents(config, caller_config, SETTING)
    name = project_files.default_agent(merged) if case.agent == "<default>" else case.agent
    ruleset, ceiling, hidden = rule_layers.session_rules(agents[name], config, caller_config, child=case.child)
    return name, ruleset, ceiling, hidden


async def decided(permission: str, pattern: str, ruleset: Ruleset, ceiling: Ruleset | None, policy: Ruleset) -> str:
    """What the permission gate makes of one ask: allow, deny, or ask (a request raised for someone)."""
    gate = PermissionGate()
    scope = AskScope("t", "ses", "call", "msg", permission, ruleset, policy, ceiling)
    raised: list[object] = []
    task = asyncio.ensure_future(gate.ask(PermissionAsk(permission, [pattern], [pattern], {}), scope, raised.append))
    for _ in range(100):
        if task.done() or raised:
            break
        await asyncio.sleep(0)
    if raised:
        gate.cancel_call("ses", "call", "done")
        await asyncio.gather(task, return_exceptions=True)
        return "ask"
    try:
        await task
    except DeniedError:
        return "deny"
    return "allow"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_effective_decision(case: Case) -> None:
    _, ruleset, ceiling, _ = session_of(case)
    policy = from_config(case.operator, home=HOME, action_only=frozenset())
    assert await decided(case.permission, case.pattern, ruleset, ceiling, policy) == case.expected
    # Upstream's merged rules alone (what main decided): the case is a widening only where they differ.
    assert await decided(case.permission, case.pattern, ruleset, None, policy) == case.upstream


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_sandbox_agent_allows_locally_only_what_the_gate_allows(case: Case) -> None:
    _, ruleset, ceiling, _ = session_of(case)
    policy = from_config(case.operator, home=HOME, action_only=frozenset())
    local = LocalRules.of(encode_rules(_snapshot(ruleset, [], policy, ceiling)))
    assert local.allows(case.permission, [case.pattern]) == (case.expected == "allow")


def test_a_tool_the_caller_denies_outright_is_hidden_from_the_workspace_agent() -> None:
    case = CASES[0]
    _, ruleset, ceiling, _ = session_of(case)
    tools = ["bash", "read", "edit", "task"]
    assert "bash" not in rule_layers.hidden_tools(tools, ruleset, None, [])  # upstream's order shows it
    assert "bash" in rule_layers.hidden_tools(tools, ruleset, ceiling, [])
    assert "read" not in rule_layers.hidden_tools(tools, ruleset, ceiling, [])


def test_task_listing_and_denied_message_follow_the_ceiling() -> None:
    files = {".opencode/agent/md.md": MD_BASH_ALLOW.encode(),
             "opencode.json": opencode({"agent": {"build": {"permission": {"task": {"*": "allow"}}}}}).encode()}
    caller_json = json.dumps({"permission": {"task": {"md": "deny"}}})
    merged, caller = project_files.session_and_caller_config(files, caller_json)
    agents = rule_layers.session_agents(json.loads(merged), json.loads(caller or "{}"), SETTING)
    build = agents["build"]
    assert rule_layers.decide("task", "md", build).action == "deny"
    assert rule_layers.decide("task", "general", build).action == "allow"


async def test_a_ceiling_deny_lists_the_callers_rules() -> None:
    ruleset = [Rule("*", "*", "allow"), Rule("bash", "*", "allow")]
    ceiling = [Rule("*", "*", "allow"), Rule("bash", "*", "deny", bare=True)]
    gate = PermissionGate()
    scope = AskScope("t", "ses", "call", "msg", "bash", ruleset, [], ceiling)
    with pytest.raises(DeniedError) as denied:
        await gate.ask(PermissionAsk("bash", ["ls"], ["ls *"], {}), scope, lambda _: None)
    assert denied.value.rules == ceiling


def test_no_workspace_config_means_no_ceiling() -> None:
    merged, caller = project_files.session_and_caller_config({}, json.dumps({"permission": {"bash": "deny"}}))
    assert caller is None
    merged, caller = project_files.session_and_caller_config({"notes/readme.md": b"x"}, "")
    assert (merged, caller) == ("", None)
    agents = rule_layers.session_agents({}, None, SETTING)
    assert all(agent.ceiling is None for agent in agents.values())


def test_an_agent_the_caller_disabled_gets_a_deny_all_ceiling() -> None:
    agents = {"x": Agent("x", "subagent", [Rule("*", "*", "allow")])}
    rule_layers.with_ceilings(agents, lambda names: {})
    assert agents["x"].ceiling == [Rule("*", "*", "deny")]
