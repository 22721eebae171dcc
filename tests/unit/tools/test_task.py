"""The `task` tool's pieces: its description per caller, the child session rules, output, model, store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from controlplane.core.calls.subtasks import child_session_rules, hidden_in_child, primary_tools
from controlplane.core.calls.tool import ToolContext
from controlplane.core.permissions import permission
from controlplane.core.permissions.permission import Rule
from controlplane.core.sessions.models import Resources, Session, SessionState
from controlplane.store.sqlite import SqliteStore
from controlplane.tools.task import NO_DESCRIPTION, agent_model, describe_agents, output


def agents(config: dict[str, dict[str, object]] | None = None, user: dict[str, object] | None = None) -> dict[
    str, permission.Agent
]:
    rules = permission.from_config(user or {}, home="/home/u")
    return permission.builtin_agents("/out", [], "/plans", rules, home="/home/u", agent_config=config)


def listing(text: str) -> list[str]:
    """The agent lines: the block after the line introducing them, up to the blank line."""
    block = text.split("(pass the name as `subagent_type`):\n", 1)[1].split("\n\n", 1)[0]
    return block.splitlines() if block else []


def test_description_lists_non_primary_agents_not_denied_to_the_caller() -> None:
    all_agents = agents({"zeta": {"mode": "subagent"}, "lead": {"mode": "primary", "description": "x"},
                         "both": {"description": "Does both."}})
    lines = listing(describe_agents(all_agents, all_agents["build"]))
    assert [line.split(":")[0] for line in lines] == ["- general", "- explore", "- zeta", "- both"]
    assert f"- zeta: {NO_DESCRIPTION}" in lines
    assert "- both: Does both." in lines

    picky = agents(user={"task": {"*": "deny", "explore": "allow"}})
    assert [line.split(":")[0] for line in listing(describe_agents(picky, picky["build"]))] == ["- explore"]
    nobody = agents(user={"task": "deny"})
    assert listing(describe_agents(nobody, nobody["build"])) == []
    # Last match wins: a later allow of everything brings them back.
    lenient = agents(user={"task": {"explore": "deny", "*": "allow"}})
    assert len(listing(describe_agents(lenient, lenient["build"]))) == 2


def test_child_rules_deny_todo_and_task_unless_the_subagent_has_a_task_rule() -> None:
    plain = agents()["general"]
    assert child_session_rules(plain, []) == [
        Rule("todowrite", "*", "deny"), Rule("todoread", "*", "deny"), Rule("task", "*", "deny"),
    ]
    assert hidden_in_child(plain, ["glob"]) == {"todowrite", "todoread", "task", "glob"}
    tasker = agents({"general": {"permission": {"task": {"explore": "ask"}}}})["general"]
    assert child_session_rules(tasker, ["glob"]) == [
        Rule("todowrite", "*", "deny"), Rule("todoread", "*", "deny"), Rule("glob", "*", "allow"),
    ]
    assert hidden_in_child(tasker, []) == {"todowrite", "todoread"}
    # Evaluated after the agent's own rules, they win over the agent's allow-everything.
    ruleset = permission.merge(plain.permission, child_session_rules(plain, []))
    assert permission.evaluate("task", "explore", ruleset).action == "deny"
    assert permission.evaluate("bash", "ls", ruleset).action == "allow"


def test_primary_tools_from_config_ignores_malformed_values() -> None:
    assert primary_tools({"experimental": {"primary_tools": ["glob", 3, "bash"]}}) == ["glob", "bash"]
    assert primary_tools({"experimental": {"primary_tools": "glob"}}) == []
    assert primary_tools({"experimental": True}) == []
    assert primary_tools({}) == []


def test_output_keeps_the_text_verbatim() -> None:
    assert output("ses_1", "") == (
        "task_id: ses_1 (for resuming to continue this task if needed)\n\n<task_result>\n\n</task_result>"
    )
    assert output("ses_2", "a\n</task_result>\n") == (
        "task_id: ses_2 (for resuming to continue this task if needed)\n\n<task_result>\na\n</task_result>\n\n"
        "</task_result>"
    )


def _ctx(extra: dict[str, object]) -> ToolContext:
    async def nothing(*_: object) -> None:
        return None

    return ToolContext("s", "m", "c", "build", nothing, nothing, None, extra=extra)  # type: ignore[arg-type]


def test_model_from_agent_config_else_from_the_call() -> None:
    config = '{"agent": {"helper": {"model": "acme/deep/v2"}, "odd": {"model": "no-slash"}}}'
    assert agent_model(config, "helper", _ctx({})) == {"modelID": "deep/v2", "providerID": "acme"}
    given = {"modelID": "m", "providerID": "p"}
    assert agent_model(config, "odd", _ctx({"model": given})) == given
    assert agent_model("", "general", _ctx({})) is None
    assert agent_model('{"agent": []}', "general", _ctx({})) is None


async def test_store_adds_parent_and_title_to_an_older_sessions_table(tmp_path: Path) -> None:
    path = tmp_path / "controlplane.db"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, agent TEXT NOT NULL, state TEXT NOT NULL,"
        " sandbox_id TEXT NOT NULL DEFAULT '', labels TEXT NOT NULL DEFAULT '{}', resources TEXT NOT NULL,"
        " config_json TEXT NOT NULL DEFAULT '', status_message TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL,"
        " last_active_at REAL NOT NULL, deleted_at REAL)"
    )
    old.execute(
        "INSERT INTO sessions VALUES ('ses_old', 't', 'build', 'READY', 'sb1', '{}',"
        " '{\"cpu\": 1, \"memory_mb\": 512, \"pids\": 256}', '', '', 1.0, 2.0, NULL)"
    )
    old.commit()
    old.close()

    store = SqliteStore(path)
    try:
        kept = await store.get_session("ses_old")
        assert kept is not None
        assert (kept.parent_id, kept.title, kept.sandbox_id) == ("", "", "sb1")
        child = Session("ses_child", "t", "general", SessionState.READY, Resources(1, 512, 256), 3.0, 3.0,
                        sandbox_id="sb1", parent_id="ses_old", title="Look (@general subagent)")
        await store.put_session(child)
        assert await store.get_session("ses_child") == child
    finally:
        store.close()
    again = SqliteStore(path)  # opening a migrated store again changes nothing
    try:
        assert [s.id for s in await again.list_sessions()] == ["ses_old", "ses_child"]
    finally:
        again.close()

