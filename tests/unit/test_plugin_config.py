"""What the platform takes from the config that project plugins' `config` hooks leave (core.config.plugin_config)."""

from __future__ import annotations

import json
from typing import Any

from controlplane.core.config.plugin_config import adopt, adopted_json

LOCAL = {"type": "local", "command": ["bun", "run", "server.ts"]}
REMOTE = {"type": "remote", "url": "https://mcp.example.test/sse"}


def hooked(own: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`own` as the tool host hands it to the hooks (its defaults added), with `changes`."""
    return {"agent": {}, "mode": {}, "plugin": [], **json.loads(json.dumps(own)), **changes}


def test_the_host_defaults_alone_change_nothing() -> None:
    own = {"permission": {"bash": "ask"}}
    assert adopt(own, hooked(own)) == (own, [])


def test_an_agent_is_added_without_rules_of_its_own() -> None:
    own = {"permission": {"edit": "ask"}}
    agent = {"description": "Reviews", "mode": "subagent", "permission": {"edit": "allow"}, "tools": {"bash": True}}
    config, notes = adopt(own, hooked(own, agent={"reviewer": agent}))
    assert config == {"permission": {"edit": "ask"}, "agent": {"reviewer": {"description": "Reviews",
                                                                            "mode": "subagent"}}}
    assert notes == [
        "agent.reviewer.permission: a hook cannot change an agent's rules; not applied",
        "agent.reviewer.tools: a hook cannot change an agent's rules; not applied",
    ]


def test_the_sessions_agents_keep_their_settings_and_rules() -> None:
    own = {"agent": {"docs": {"model": "a/b", "permission": {"bash": "deny"}}, "plan": {"steps": 4}}}
    changed = {"docs": {"model": "c/d", "prompt": "Write docs", "permission": {"bash": "allow"}}}
    config, notes = adopt(own, hooked(own, agent=changed))  # `plan` removed by the hook
    assert config == {"agent": {
        "docs": {"model": "a/b", "prompt": "Write docs", "permission": {"bash": "deny"}},
        "plan": {"steps": 4},
    }}
    assert notes == ["agent.docs.permission: a hook cannot change an agent's rules; not applied"]


def test_rules_and_other_keys_stay_the_sessions() -> None:
    own = {"permission": {"webfetch": "ask"}, "experimental": {"batch_tool": False}}
    changes = {"permission": {"webfetch": "allow"}, "experimental": {"batch_tool": True}, "tools": {"bash": False},
               "instructions": ["x.md"]}
    config, notes = adopt(own, hooked(own, **changes))
    assert config == own
    assert notes == [
        "permission: changed by a hook; the session's own is kept",
        "experimental: changed by a hook; the session's own is kept",
        "tools: added by a hook; not applied (a plugin may add agents and local MCP servers only)",
        "instructions: added by a hook; not applied (a plugin may add agents and local MCP servers only)",
    ]


def test_only_local_servers_are_added_and_the_sessions_stay() -> None:
    own = {"mcp": {"mine": REMOTE}}
    servers = {"mine": {**REMOTE, "url": "https://elsewhere.example.test/sse"}, "tools": LOCAL, "out": REMOTE,
               "odd": "not a server"}
    config, notes = adopt(own, hooked(own, mcp=servers))
    assert config == {"mcp": {"mine": REMOTE, "tools": LOCAL}}
    assert notes == [
        "mcp.mine: changed by a hook; the session's own is kept",
        "mcp.out: only a local server (run in the sandbox) may be added by a hook; not applied",
        "mcp.odd: only a local server (run in the sandbox) may be added by a hook; not applied",
    ]


def test_removed_servers_and_sections_come_back() -> None:
    own = {"mcp": {"mine": LOCAL}, "agent": {"docs": {"model": "a/b"}}}
    config, notes = adopt(own, {"agent": "gone", "mcp": []})
    assert config == own
    assert notes == ["agent: a hook left it not an object; the session's own is kept",
                     "mcp: a hook left it not an object; the session's own is kept"]


def test_json_in_and_out() -> None:
    own = json.dumps({"permission": {"bash": "ask"}})
    text, notes = adopted_json(own, json.dumps(hooked(json.loads(own), mcp={"tools": LOCAL})))
    assert json.loads(text) == {"permission": {"bash": "ask"}, "mcp": {"tools": LOCAL}}
    assert notes == ()
    assert adopted_json(own, "[1, 2]") == (own, ("the config the hooks left is not a JSON object; "
                                                 "the session's own is kept",))


def test_agent_settings_the_platform_would_refuse_are_left_out() -> None:
    added = {"odd": {"mode": "sometimes", "description": 7, "hidden": "yes", "prompt": "Be odd"}}
    config, notes = adopt({}, hooked({}, agent=added))
    assert config == {"agent": {"odd": {"prompt": "Be odd"}}}
    assert notes == [
        "agent.odd.mode: must be primary, subagent or all; not applied",
        "agent.odd.description: must be a string; not applied",
        "agent.odd.hidden: must be true or false; not applied",
    ]
