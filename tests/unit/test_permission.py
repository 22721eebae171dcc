"""Wildcards, rule evaluation, config parsing and the built-in agents' rules (opencode-tools.md §5)."""

from __future__ import annotations

import json

import pytest

from controlplane.core.calls.tool import ToolError
from controlplane.core.permissions.permission import (
    REJECTED_MESSAGE,
    CorrectedError,
    DeniedError,
    RejectedError,
    Rule,
    builtin_agents,
    corrected_message,
    default_agent_rulesets,
    denied_message,
    disabled,
    evaluate,
    expand_home,
    from_config,
    merge,
)
from controlplane.errors import ConfigError
from opencode_semantics.javascript import js_keys
from opencode_semantics.wildcard import match

HOME = "/home/u"
OUT = "/home/u/.local/share/opencode/tool-output"
SKILL = "/home/u/.config/opencode/skills/demo"
PLANS = "/home/u/.local/share/opencode/plans"

# --- wildcard ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pattern", "expected"),
    [
        ("ls", "ls *", True),
        ("ls -la", "ls *", True),
        ("lstmeval", "ls *", False),
        ("lstmeval", "ls*", True),
        ("ls", "ls*", True),
        ("ls  -la", "ls *", True),
        ("git status", "git *", True),
        ("git", "git *", True),
        ("gitx", "git *", False),
        ("a/b/c.ts", "*.ts", True),  # * crosses "/"
        ("src/x/y", "src/*", True),
        ("a\nb", "a*b", True),  # and newlines (dotall)
        ("echo hi\nrm -rf /", "echo *", True),
        ("abc", "a?c", True),
        ("ac", "a?c", False),
        ("a/c", "a?c", True),
        ("a\nc", "a?c", True),
        ("abc", "b", False),  # anchored
        ("abc", "ab", False),
        ("xabc", "abc", False),
        ("abc\n", "abc", False),  # no "$ before final newline" leniency
        ("ABC", "abc", False),  # case-sensitive
        ("C:\\Users\\x", "C:/Users/*", True),  # backslashes -> "/" in the text
        ("C:/Users/x", "C:\\Users\\*", True),  # and in the pattern
        ("a\\b", "a/b", True),
        ("file.txt", "file.txt", True),
        ("fileXtxt", "file.txt", False),  # "." is literal
        ("a+b", "a+b", True),
        ("aab", "a+b", False),
        ("(x)|[y]{1}^$", "(x)|[y]{1}^$", True),
        ("", "*", True),
        ("", "", True),
        ("x", "", False),
        ("ls *", "ls \\*", False),  # "\*" becomes "/*": a slash then anything
        ("ls /tmp", "ls \\*", True),
        ("😀", "?", False),  # "?" is one UTF-16 unit, as in JS
        ("😀", "??", True),
        ("a😀b", "a*b", True),
        ("x *", "x *", True),
    ],
)
def test_wildcard(text: str, pattern: str, expected: bool) -> None:
    assert match(text, pattern) is expected


def test_only_a_trailing_space_star_is_optional() -> None:
    assert match("ls", "ls * x") is False
    assert match("ls a x", "ls * x") is True
    assert match("rm", "rm -rf *") is False
    assert match("rm -rf", "rm -rf *") is True


# --- evaluate / merge / disabled -----------------------------------------------------------------


def test_evaluate_last_match_wins_without_specificity() -> None:
    rules = [Rule("bash", "git *", "allow"), Rule("bash", "*", "deny")]
    assert evaluate("bash", "git status", rules) == Rule("bash", "*", "deny")
    rules = [Rule("bash", "*", "deny"), Rule("bash", "git *", "allow")]
    assert evaluate("bash", "git status", rules).action == "allow"
    assert evaluate("bash", "rm -rf /", rules).action == "deny"


def test_evaluate_matches_permission_by_wildcard_and_defaults_to_ask() -> None:
    rules = [Rule("*", "*", "allow"), Rule("mcp_*", "*", "deny")]
    assert evaluate("mcp_query", "x", rules).action == "deny"
    assert evaluate("read", "x", rules).action == "allow"
    assert evaluate("read", "/a/b", []) == Rule("read", "*", "ask")


def test_evaluate_flattens_several_rulesets_in_order() -> None:
    first = [Rule("edit", "*", "deny")]
    second = [Rule("edit", "*.md", "allow")]
    assert evaluate("edit", "README.md", first, second).action == "allow"
    assert evaluate("edit", "README.md", second, first).action == "deny"
    assert merge(first, second) == first + second


def test_disabled_needs_a_final_blanket_deny() -> None:
    tools = ["bash", "read", "edit", "write", "patch", "multiedit", "apply_patch", "grep", "myserver_q"]
    assert disabled(tools, [Rule("edit", "*", "deny")]) == {"edit", "write", "patch", "multiedit", "apply_patch"}
    assert disabled(tools, [Rule("bash", "*", "deny"), Rule("bash", "git *", "allow")]) == set()
    assert disabled(tools, [Rule("bash", "git *", "allow"), Rule("bash", "*", "deny")]) == {"bash"}
    assert disabled(tools, [Rule("bash", "rm *", "deny")]) == set()
    assert disabled(tools, [Rule("myserver_*", "*", "deny")]) == {"myserver_q"}
    assert disabled(tools, [Rule("myserver", "*", "deny")]) == set()  # a bare server name matches nothing
    everything = disabled(tools, [Rule("*", "*", "deny"), Rule("read", "*", "allow")])
    assert everything == set(tools) - {"read"}
    assert disabled(["write"], [Rule("write", "*", "deny")]) == set()  # write is governed by "edit"


# --- from_config ---------------------------------------------------------------------------------


def test_from_config_keeps_key_order() -> None:
    cfg = json.loads(
        '{"*": "ask", "edit": "deny", "write": "allow", "external_directory": {"/tmp/*": "allow", "*": "deny"},'
        ' "read": "allow", "todowrite": "deny", "todoread": "allow", "thoughts_*": "allow",'
        ' "bash": {"git *": "allow", "rm *": "deny"}}'
    )
    rules = from_config(cfg, home=HOME)
    assert [(r.permission, r.pattern, r.action) for r in rules] == [
        ("*", "*", "ask"),
        ("edit", "*", "deny"),
        ("write", "*", "allow"),
        ("external_directory", "/tmp/*", "allow"),
        ("external_directory", "*", "deny"),
        ("read", "*", "allow"),
        ("todowrite", "*", "deny"),
        ("todoread", "*", "allow"),
        ("thoughts_*", "*", "allow"),
        ("bash", "git *", "allow"),
        ("bash", "rm *", "deny"),
    ]


def test_from_config_bare_string() -> None:
    assert from_config("deny", home=HOME) == [Rule("*", "*", "deny")]


def test_from_config_orders_integer_keys_first_like_js() -> None:
    rules = from_config({"bash": {"*": "ask", "10": "allow", "2": "deny", "01": "allow"}}, home=HOME)
    assert [r.pattern for r in rules] == ["2", "10", "*", "01"]
    assert js_keys(["b", "4294967295", "4294967294", "a", "0"]) == ["0", "4294967294", "b", "4294967295", "a"]


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("~/x/*", "/home/u/x/*"),
        ("~", "/home/u"),
        ("$HOME/x", "/home/u/x"),
        ("$HOME", "/home/u"),
        ("$HOMEX", "/home/uX"),  # upstream's prefix replacement
        ("/a/~/b", "/a/~/b"),
        ("~x", "~x"),
        ("a$HOME", "a$HOME"),
    ],
)
def test_home_expansion(pattern: str, expanded: str) -> None:
    assert expand_home(pattern, HOME) == expanded
    assert from_config({"read": {pattern: "allow"}}, home=HOME) == [Rule("read", expanded, "allow")]


def test_home_expansion_only_applies_to_patterns() -> None:
    assert from_config({"~": "allow"}, home=HOME) == [Rule("~", "*", "allow")]


@pytest.mark.parametrize(
    "cfg", [{"bash": "maybe"}, {"bash": {"*": "yes"}}, {"bash": 1}, {"bash": ["allow"]}, "sure"],
)
def test_from_config_rejects_bad_actions(cfg: object) -> None:
    with pytest.raises(ConfigError):
        from_config(cfg, home=HOME)  # type: ignore[arg-type]


# --- messages ------------------------------------------------------------------------------------


def test_refusal_messages() -> None:
    assert REJECTED_MESSAGE == "The user rejected permission to use this specific tool call."
    assert corrected_message("use rg") == (
        "The user rejected permission to use this specific tool call with the following feedback: use rg"
    )
    assert str(RejectedError()) == REJECTED_MESSAGE
    err = CorrectedError("no")
    assert isinstance(err, ToolError)
    assert (str(err), err.feedback) == (corrected_message("no"), "no")


def test_denied_message_json_matches_upstream_key_order() -> None:
    # A session's ask parses its rules with upstream's rule schema: bare actions are written
    # permission, pattern, action too.
    ruleset = from_config({"*": "allow", "bash": {"*": "ask", "rm *": "deny"}, "edit": "deny"}, home=HOME)
    rules = [r for r in ruleset if r.permission in ("*", "bash")]
    assert denied_message(rules) == (
        "The user has specified a rule which prevents you from using this specific tool call. "
        'Here are some of the relevant rules [{"permission":"*","pattern":"*","action":"allow"},'
        '{"permission":"bash","pattern":"*","action":"ask"},{"permission":"bash","pattern":"rm *","action":"deny"}]'
    )
    assert str(DeniedError(rules)) == denied_message(rules)
    assert DeniedError(rules).rules == rules


def test_denied_message_json_escaping() -> None:
    message = denied_message([Rule("bash", 'echo "é"\n\t\\', "deny")])
    assert message.endswith('[{"permission":"bash","pattern":"echo \\"é\\"\\n\\t\\\\","action":"deny"}]')
    assert denied_message([]).endswith("relevant rules []")
    assert denied_message([Rule("x", "\ud800", "deny")]).endswith('"pattern":"\\ud800","action":"deny"}]')


# --- default agent rules -------------------------------------------------------------------------


def rulesets(user: list[Rule] | None = None) -> dict[str, list[Rule]]:
    return default_agent_rulesets(OUT, [SKILL], PLANS, user or [], worktree="/home/u/project")


def test_default_rulesets_names() -> None:
    assert list(rulesets()) == ["build", "plan", "general", "explore", "compaction", "title", "summary"]


def test_build_ruleset_exactly() -> None:
    assert rulesets()["build"] == [
        Rule("*", "*", "allow"),
        Rule("doom_loop", "*", "ask"),
        Rule("external_directory", "*", "ask"),
        Rule("external_directory", OUT + "/*", "allow"),
        Rule("external_directory", SKILL + "/*", "allow"),
        Rule("question", "*", "deny"),
        Rule("plan_enter", "*", "deny"),
        Rule("plan_exit", "*", "deny"),
        Rule("read", "*", "allow"),
        Rule("read", "*.env", "ask"),
        Rule("read", "*.env.*", "ask"),
        Rule("read", "*.env.example", "allow"),
        Rule("question", "*", "allow"),
        Rule("plan_enter", "*", "allow"),
        Rule("external_directory", OUT + "/*", "allow"),
    ]


def test_build_allows_everything_but_env_reads_ask() -> None:
    build = rulesets()["build"]
    for perm in ("bash", "edit", "write", "task", "webfetch", "myserver_tool", "question"):
        assert evaluate(perm, "anything", build).action == "allow"
    assert evaluate("read", "/p/.env", build).action == "ask"
    assert evaluate("read", "/p/.env.local", build).action == "ask"
    assert evaluate("read", "/p/.env.example", build).action == "allow"
    assert evaluate("read", "/p/main.py", build).action == "allow"
    assert evaluate("doom_loop", "bash", build).action == "ask"
    assert evaluate("plan_exit", "*", build).action == "deny"
    assert evaluate("external_directory", "/etc/*", build).action == "ask"
    assert evaluate("external_directory", OUT + "/*", build).action == "allow"
    assert evaluate("external_directory", SKILL + "/*", build).action == "allow"


def test_plan_denies_edits_except_plan_files() -> None:
    plan = rulesets()["plan"]
    assert evaluate("edit", "src/main.py", plan).action == "deny"
    assert evaluate("edit", ".opencode/plans/x.md", plan).action == "allow"
    # The data dir's plans named relative to the worktree (path.relative upstream).
    assert Rule("edit", "../.local/share/opencode/plans/*.md", "allow") in plan
    assert evaluate("external_directory", PLANS + "/*", plan).action == "allow"
    assert evaluate("plan_exit", "*", plan).action == "allow"
    assert evaluate("plan_enter", "*", plan).action == "deny"
    assert evaluate("question", "*", plan).action == "allow"


def test_plan_relative_path_with_root_worktree() -> None:
    plan = default_agent_rulesets(OUT, [], PLANS, [])["plan"]
    assert Rule("edit", "home/u/.local/share/opencode/plans/*.md", "allow") in plan


def test_general_denies_todos_only() -> None:
    general = rulesets()["general"]
    assert evaluate("todowrite", "*", general).action == "deny"
    assert evaluate("todoread", "*", general).action == "deny"
    assert evaluate("bash", "ls", general).action == "allow"
    assert evaluate("question", "*", general).action == "deny"


def test_explore_is_read_only() -> None:
    explore = rulesets()["explore"]
    for perm in ("edit", "write", "task", "todowrite", "doom_loop", "myserver_tool"):
        assert evaluate(perm, "x", explore).action == "deny", perm
    for perm in ("grep", "glob", "list", "bash", "webfetch", "websearch", "codesearch", "read"):
        assert evaluate(perm, "x", explore).action == "allow", perm
    # Its own "read: allow" comes after the defaults' .env rules.
    assert evaluate("read", "/p/.env", explore).action == "allow"
    assert evaluate("external_directory", "/etc/*", explore).action == "ask"
    assert evaluate("external_directory", SKILL + "/*", explore).action == "allow"
    assert disabled(["edit", "apply_patch", "task", "bash"], explore) == {"edit", "apply_patch", "task"}


@pytest.mark.parametrize("name", ["compaction", "title", "summary"])
def test_hidden_agents_deny_everything_but_tool_output(name: str) -> None:
    ruleset = rulesets()[name]
    assert evaluate("read", "x", ruleset).action == "deny"
    assert evaluate("external_directory", OUT + "/*", ruleset).action == "allow"
    assert ruleset[-1] == Rule("external_directory", OUT + "/*", "allow")


def test_user_rules_come_after_agent_rules() -> None:
    user = from_config({"bash": {"*": "ask"}, "todowrite": "allow"}, home=HOME)
    sets = rulesets(user)
    assert sets["build"][-3:] == [*user, Rule("external_directory", OUT + "/*", "allow")]
    assert evaluate("todowrite", "*", sets["general"]).action == "allow"
    assert evaluate("bash", "ls", sets["explore"]).action == "ask"


def test_tool_output_allowance_is_skipped_when_explicitly_denied() -> None:
    user = [Rule("external_directory", OUT + "/*", "deny")]
    sets = rulesets(user)
    assert sets["build"][-1] == user[0]
    assert evaluate("external_directory", OUT + "/*", sets["build"]).action == "deny"
    # Only that exact glob counts as explicit.
    sets = rulesets([Rule("external_directory", "*", "deny")])
    assert sets["build"][-1] == Rule("external_directory", OUT + "/*", "allow")


def test_builtin_agents() -> None:
    agents = builtin_agents(OUT, [SKILL], PLANS, [], home=HOME, worktree="/home/u/project")
    assert {n: (a.mode, a.hidden) for n, a in agents.items()} == {
        "build": ("primary", False),
        "plan": ("primary", False),
        "general": ("subagent", False),
        "explore": ("subagent", False),
        "compaction": ("primary", True),
        "title": ("primary", True),
        "summary": ("primary", True),
    }
    assert agents["build"].description == "The default agent. Executes tools based on configured permissions."
    assert agents["plan"].description == "Plan mode. Disallows all edit tools."
    assert agents["general"].description == (
        "General-purpose agent for researching complex questions and executing multi-step tasks. "
        "Use this agent to execute multiple units of work in parallel."
    )
    assert agents["explore"].description is not None
    assert agents["explore"].description.startswith("Fast agent specialized for exploring codebases.")
    assert agents["title"].description is None
    defaults = rulesets()
    assert {n: a.permission for n, a in agents.items()} == defaults


def test_agent_config_overrides_and_custom_agents() -> None:
    agents = builtin_agents(
        OUT, [], PLANS, [],
        agent_config={
            "title": {"disable": True},
            "general": {"mode": "primary", "hidden": None, "permission": {"bash": "deny"}},
            "reviewer": {"description": "Reviews", "permission": {"edit": {"~/notes/*": "allow"}}},
        },
        home=HOME,
        worktree="/home/u/project",
    )
    assert "title" not in agents
    general = agents["general"]
    assert (general.mode, general.hidden) == ("primary", False)
    assert evaluate("bash", "ls", general.permission).action == "deny"
    assert general.permission[-1] == Rule("external_directory", OUT + "/*", "allow")
    reviewer = agents["reviewer"]
    assert (reviewer.mode, reviewer.native, reviewer.description) == ("all", False, "Reviews")
    assert evaluate("edit", "/home/u/notes/a", reviewer.permission).action == "allow"
    assert evaluate("question", "*", reviewer.permission).action == "deny"  # defaults, not build's
    assert reviewer.permission[-1] == Rule("external_directory", OUT + "/*", "allow")


def test_agent_config_rejects_unknown_mode() -> None:
    with pytest.raises(ConfigError, match=r"agent\.build\.mode"):
        builtin_agents(OUT, [], PLANS, [], home=HOME, agent_config={"build": {"mode": "boss"}})
