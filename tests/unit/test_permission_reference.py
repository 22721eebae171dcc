"""Reference §5/§8/§14, sentence by sentence: config shapes, rule order, asks and replies, refusals."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.core.calls.tool import PermissionAsk
from controlplane.core.calls.tool_events import PermissionRequested
from controlplane.core.config import project_config
from controlplane.core.permissions import permission
from controlplane.core.permissions.asks import AskScope, PermissionGate, Reply
from controlplane.core.permissions.permission import Rule, disabled, evaluate, from_config
from controlplane.core.permissions.policy import OperatorPolicy
from controlplane.core.sessions.events import BusEvent, EventBus
from controlplane.errors import ConfigError, NotFoundError

ACTION_ONLY = ["todowrite", "todoread", "question", "webfetch", "websearch", "codesearch", "doom_loop"]
RULE_OR_MAP = ["read", "edit", "glob", "grep", "list", "bash", "task", "external_directory", "lsp", "skill"]


# --- config shapes (§5 "Config keys with typed schemas", §8) ------------------------------------


@pytest.mark.parametrize("key", ACTION_ONLY)
def test_action_only_keys_reject_a_map_of_patterns(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^permission\.{key} must be one of allow, deny, ask"):
        from_config({key: {"*": "allow"}}, home="/h")
    assert from_config({key: "deny"}, home="/h") == [Rule(key, "*", "deny")]


@pytest.mark.parametrize("key", [*RULE_OR_MAP, "myserver_*", "thoughts_*", "custom_tool"])
def test_rule_or_map_and_catch_all_keys_take_patterns(key: str) -> None:
    assert from_config({key: {"b*": "deny", "a": "ask"}}, home="/h") == [
        Rule(key, "b*", "deny"), Rule(key, "a", "ask"),
    ]


def test_action_only_keys_are_checked_in_agent_config_too() -> None:
    with pytest.raises(ConfigError, match=r"^permission\.webfetch "):
        permission.builtin_agents(
            "/o", [], "/p", [], home="/h", agent_config={"build": {"permission": {"webfetch": {"https://*": "deny"}}}},
        )


def test_operator_policy_may_give_patterns_to_any_key() -> None:
    policy = OperatorPolicy(permission={"webfetch": {"http://169.254.*": "deny"}, "todowrite": "allow"})
    assert policy.rules("t", home="/h") == [
        Rule("webfetch", "http://169.254.*", "deny"), Rule("todowrite", "*", "allow"),
    ]


def test_bare_string_permission_and_its_key_order_with_legacy_tools() -> None:
    assert from_config("ask", home="/h") == [Rule("*", "*", "ask")]
    # tools first (edit folded), then explicit permission keys: the explicit `*` comes last and wins.
    value = project_config.user_permission({"tools": {"write": False, "bash": True}, "permission": "allow"})
    assert value == {"edit": "deny", "bash": "allow", "*": "allow"}
    rules = from_config(value, home="/h")
    assert evaluate("edit", "x", rules).action == "allow"


def test_legacy_tools_keep_a_map_given_explicitly() -> None:
    value = project_config.user_permission({"tools": {"bash": False}, "permission": {"bash": {"ls *": "allow"}}})
    assert value == {"bash": {"ls *": "allow"}}  # an object replaces the migrated string, not merged into it


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("~", "/home/u"), ("~/", "/home/u/"), ("~/a/*", "/home/u/a/*"), ("$HOME", "/home/u"),
        ("$HOME/a", "/home/u/a"), ("~user/a", "~user/a"), ("a/~/b", "a/~/b"), ("~\\a", "~\\a"),
        (" ~/a", " ~/a"), ("*~/a", "*~/a"),
    ],
)
def test_home_expansion_edge_cases(pattern: str, expanded: str) -> None:
    assert from_config({"read": {pattern: "deny"}}, home="/home/u") == [Rule("read", expanded, "deny")]


def test_windows_style_paths_match_with_forward_slashes() -> None:
    rules = from_config({"external_directory": {"C:\\Users\\me\\*": "allow"}}, home="/h")
    assert evaluate("external_directory", "C:/Users/me/x", rules).action == "allow"
    assert evaluate("external_directory", "C:\\Users\\me\\x", rules).action == "allow"
    assert evaluate("external_directory", "c:/users/me/x", rules).action == "ask"  # case-sensitive off Windows


def test_patterns_with_regex_characters_are_literal() -> None:
    rules = from_config({"bash": {"echo $(whoami)": "deny", "grep a.b *": "deny", "x[1]": "deny"}}, home="/h")
    assert evaluate("bash", "echo $(whoami)", rules).action == "deny"
    assert evaluate("bash", "grep axb file", rules).action == "ask"
    assert evaluate("bash", "grep a.b", rules).action == "deny"  # "grep a.b *" also matches without arguments
    assert evaluate("bash", "x1", rules).action == "ask"
    assert evaluate("bash", "x[1]", rules).action == "deny"


def test_empty_pattern_matches_only_the_empty_text() -> None:
    rules = [Rule("bash", "*", "allow"), Rule("bash", "", "deny")]
    assert evaluate("bash", "", rules).action == "deny"
    assert evaluate("bash", " ", rules).action == "allow"


def test_disabled_edit_alias_and_wildcard_permissions() -> None:
    rules = [Rule("*", "*", "allow"), Rule("ed*", "*", "deny")]
    tools = ["edit", "write", "apply_patch", "multiedit", "patch", "read", "bash"]
    assert disabled(tools, rules) == {"edit", "write", "apply_patch", "multiedit", "patch"}
    assert disabled(["bash"], [Rule("bash", "*", "deny"), Rule("bash", "ls", "allow")]) == set()
    assert disabled(["bash"], [Rule("bash", "ls", "allow"), Rule("bash", "*", "deny")]) == {"bash"}
    assert disabled(["bash"], [Rule("bash", "**", "deny")]) == set()  # only the literal "*" pattern hides


# --- asks and replies (§5 ask/reply, §14) -------------------------------------------------------


def _scope(call: str, ruleset: list[Rule], policy: list[Rule] | None = None, session: str = "s") -> AskScope:
    return AskScope("t", session, call, "m", "bash", ruleset, policy or [])


async def _pending(
    gate: PermissionGate, ask: PermissionAsk, scope: AskScope, heard: list[PermissionRequested],
) -> asyncio.Future[None]:
    waiting = asyncio.ensure_future(gate.ask(ask, scope, heard.append))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    return waiting


def _replies(events: list[BusEvent]) -> list[tuple[str, str]]:
    return [(e.properties["requestID"], e.properties["reply"]) for e in events if e.type == "permission.replied"]


class _Recorder:
    def __init__(self, bus: EventBus) -> None:
        self.events: list[BusEvent] = []
        bus.listen(self._heard)

    async def _heard(self, event: BusEvent) -> None:
        self.events.append(event)


async def test_always_does_not_settle_a_request_the_operator_wants_asked() -> None:
    bus = EventBus()
    heard_events = _Recorder(bus)
    gate = PermissionGate(bus=bus)
    ask_all = [Rule("bash", "*", "ask")]
    operator = [Rule("bash", "rm *", "ask")]
    heard: list[PermissionRequested] = []
    first = await _pending(gate, PermissionAsk("bash", ["rm a"], ["rm *"], {}), _scope("c1", ask_all, operator), heard)
    second = await _pending(gate, PermissionAsk("bash", ["rm b"], ["rm *"], {}), _scope("c2", ask_all, operator), heard)
    plain = await _pending(gate, PermissionAsk("bash", ["ls"], ["ls *"], {}), _scope("c3", ask_all), heard)
    await gate.reply(heard[0].id, Reply.ALWAYS)
    await first
    await asyncio.sleep(0)
    assert not second.done()  # the operator's ask comes after the approval
    assert not plain.done()  # "rm *" does not cover "ls"
    await asyncio.sleep(0)
    assert _replies(heard_events.events) == [(heard[0].id, "always")]
    await gate.reply(heard[2].id, Reply.ONCE)
    await plain
    await gate.reply(heard[1].id, Reply.ONCE)
    await second


async def test_always_settles_other_pending_requests_whose_patterns_all_become_allowed() -> None:
    bus = EventBus()
    recorder = _Recorder(bus)
    gate = PermissionGate(bus=bus)
    rules = [Rule("bash", "*", "ask")]
    heard: list[PermissionRequested] = []
    status = PermissionAsk("bash", ["git status"], ["git status *"], {})
    first = await _pending(gate, status, _scope("c1", rules), heard)
    both = await _pending(
        gate, PermissionAsk("bash", ["git status -s", "git diff"], ["git status *", "git diff *"], {}),
        _scope("c2", rules), heard,
    )
    covered = await _pending(gate, PermissionAsk("bash", ["git status -s"], [], {}), _scope("c3", rules), heard)
    elsewhere = await _pending(gate, status, _scope("c4", rules, session="other"), heard)
    await gate.reply(heard[0].id, Reply.ALWAYS)
    await first
    await covered  # settled by the approval although its own `always` list is empty
    await asyncio.sleep(0)
    assert not both.done()
    assert not elsewhere.done()
    assert _replies(recorder.events) == [(heard[0].id, "always"), (heard[2].id, "always")]
    assert await gate.approved("t", "s") == [Rule("bash", "git status *", "allow")]  # the `always` list, not patterns
    assert await gate.approved("t", "other") == []
    for request in (heard[1], heard[3]):
        await gate.reply(request.id, Reply.REJECT)
    with pytest.raises(permission.RejectedError):
        await both
    with pytest.raises(permission.RejectedError):
        await elsewhere


async def test_reject_with_feedback_corrects_one_and_rejects_the_rest_of_the_session_only() -> None:
    bus = EventBus()
    recorder = _Recorder(bus)
    gate = PermissionGate(bus=bus)
    rules = [Rule("*", "*", "ask")]
    heard: list[PermissionRequested] = []
    target = await _pending(gate, PermissionAsk("bash", ["a"], ["a"], {}), _scope("c1", rules), heard)
    sibling = await _pending(gate, PermissionAsk("edit", ["f"], ["*"], {}), _scope("c2", rules), heard)
    other = await _pending(gate, PermissionAsk("bash", ["a"], ["a"], {}), _scope("c3", rules, session="s2"), heard)
    await gate.reply(heard[0].id, Reply.REJECT, "use jj")
    with pytest.raises(permission.CorrectedError) as corrected:
        await target
    assert str(corrected.value) == (
        "The user rejected permission to use this specific tool call with the following feedback: use jj"
    )
    with pytest.raises(permission.RejectedError) as rejected:
        await sibling
    assert str(rejected.value) == "The user rejected permission to use this specific tool call."
    await asyncio.sleep(0)
    assert not other.done()
    assert _replies(recorder.events) == [(heard[0].id, "reject"), (heard[1].id, "reject")]
    with pytest.raises(NotFoundError):  # settled: upstream ignores it, the API answers NOT_FOUND
        await gate.reply(heard[0].id, Reply.ONCE)
    await gate.reply(heard[2].id, Reply.REJECT, "")  # an empty message is no feedback
    with pytest.raises(permission.RejectedError):
        await other


async def test_once_remembers_nothing() -> None:
    gate = PermissionGate()
    heard: list[PermissionRequested] = []
    ask = PermissionAsk("bash", ["ls"], ["ls *"], {})
    for round_ in range(2):
        waiting = await _pending(gate, ask, _scope(f"c{round_}", []), heard)
        await gate.reply(heard[-1].id, Reply.ONCE)
        await waiting
    assert len(heard) == 2
    assert await gate.approved("t", "s") == []


async def test_a_later_denied_pattern_wins_over_an_earlier_ask() -> None:
    gate = PermissionGate()
    rules = from_config({"bash": {"*": "ask", "rm *": "deny", "ls *": "allow"}}, home="/h")
    heard: list[PermissionRequested] = []
    with pytest.raises(permission.DeniedError) as denied:
        await gate.ask(PermissionAsk("bash", ["echo", "ls", "rm -rf /"], ["*"], {}), _scope("c", rules), heard.append)
    assert heard == []
    assert str(denied.value) == (
        "The user has specified a rule which prevents you from using this specific tool call. Here are some of the "
        'relevant rules [{"permission":"bash","pattern":"*","action":"ask"},'
        '{"permission":"bash","pattern":"rm *","action":"deny"},'
        '{"permission":"bash","pattern":"ls *","action":"allow"}]'
    )


async def test_denied_message_lists_the_rules_of_the_requested_permission() -> None:
    # Upstream's session ask lists `ruleset.filter(r => Wildcard.match(permission, r.permission))`
    # (tests/oracle, group denied).
    gate = PermissionGate()
    rules = from_config({"*": "allow", "ba*": {"x": "allow"}, "read": "deny", "bash": "deny"}, home="/h")
    with pytest.raises(permission.DeniedError) as denied:
        await gate.ask(PermissionAsk("bash", ["x"], ["x"], {}), _scope("c", rules), lambda _: None)
    assert str(denied.value).endswith(
        '[{"permission":"*","pattern":"*","action":"allow"},{"permission":"ba*","pattern":"x","action":"allow"},'
        '{"permission":"bash","pattern":"*","action":"deny"}]'
    )


async def test_denied_message_shows_no_operator_rule_but_the_denying_one() -> None:
    gate = PermissionGate()
    rules = from_config({"bash": "allow"}, home="/h")
    policy = [Rule("bash", "curl *", "deny"), Rule("bash", "secret-tool *", "deny"), Rule("read", "/etc/*", "deny")]
    with pytest.raises(permission.DeniedError) as denied:
        await gate.ask(PermissionAsk("bash", ["curl x"], ["curl *"], {}), _scope("c", rules, policy), lambda _: None)
    assert str(denied.value).endswith(
        '[{"permission":"bash","pattern":"*","action":"allow"},'
        '{"permission":"bash","pattern":"curl *","action":"deny"}]'
    )
    # An agent rule that denies: no operator rule is shown at all.
    own = from_config({"bash": {"rm *": "deny"}}, home="/h")
    with pytest.raises(permission.DeniedError) as denied:
        await gate.ask(PermissionAsk("bash", ["rm x"], ["rm *"], {}), _scope("c", own, policy), lambda _: None)
    assert "curl" not in str(denied.value)
    assert "secret-tool" not in str(denied.value)


async def test_no_matching_rule_asks() -> None:
    gate = PermissionGate()
    heard: list[PermissionRequested] = []
    waiting = await _pending(gate, PermissionAsk("custom", ["x"], ["x"], {"k": 1}), _scope("c", []), heard)
    assert [(r.permission, r.patterns, r.always, r.metadata) for r in heard] == [("custom", ["x"], ["x"], {"k": 1})]
    assert heard[0].id.startswith("per_")
    gate.cancel_call("s", "c", "Tool execution aborted")
    with pytest.raises(Exception, match=r"^Tool execution aborted$"):
        await waiting
    assert gate.pending("s") == []


async def test_an_ask_without_patterns_is_allowed_even_under_a_deny_all() -> None:
    gate = PermissionGate()
    heard: list[PermissionRequested] = []
    await gate.ask(PermissionAsk("bash", [], ["*"], {}), _scope("c", [Rule("*", "*", "deny")]), heard.append)
    assert heard == []  # upstream loops over the patterns: none means nothing to deny or ask


async def test_the_asked_event_carries_upstreams_request_object() -> None:
    bus = EventBus()
    recorder = _Recorder(bus)
    gate = PermissionGate(bus=bus)
    heard: list[PermissionRequested] = []
    scope = AskScope("t", "ses_9", "call_9", "msg_9", "bash", [])
    waiting = await _pending(gate, PermissionAsk("bash", ["ls"], ["ls *"], {"command": "ls"}), scope, heard)
    await asyncio.sleep(0)
    [asked] = [e for e in recorder.events if e.type == "permission.asked"]
    assert list(asked.properties.items()) == [
        ("id", heard[0].id), ("sessionID", "ses_9"), ("permission", "bash"), ("patterns", ["ls"]),
        ("metadata", {"command": "ls"}), ("always", ["ls *"]), ("tool", {"messageID": "msg_9", "callID": "call_9"}),
    ]
    await gate.reply(heard[0].id, Reply.ONCE)
    await waiting
    await asyncio.sleep(0)
    [replied] = [e for e in recorder.events if e.type == "permission.replied"]
    assert list(replied.properties.items()) == [("sessionID", "ses_9"), ("requestID", heard[0].id), ("reply", "once")]
