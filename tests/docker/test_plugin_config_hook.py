"""Project plugins' `config` hooks, which upstream runs once at plugin init on its live config, through the public
gRPC API in a real sandbox: the agents and local MCP servers they add are the session's; what a sandboxed plugin
may not change (the caller's rules, servers the control plane would connect to) is reported and not applied; a
hook that throws is reported and does not undo the others."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from tests.archives import tar_of
from tests.planes import Plane

pytestmark = pytest.mark.docker

MCP_SERVER_TS = (Path(__file__).with_name("mcp_stdio_server.ts")).read_text()
ADOPTION = "opencode.json (plugin config hooks)"

# Written the way plugins in the wild write it: mutate the config in place, assume `agent` exists.
SETUP_PLUGIN = """\
import type { Plugin } from "@opencode-ai/plugin"

export const Setup: Plugin = async () => ({
  config: async (config) => {
    config.agent.reviewer = {
      description: "Reviews a change without touching it",
      mode: "subagent",
      permission: { bash: "deny" },
    }
    config.permission = { ...(config.permission ?? {}), webfetch: "deny", grep: "allow" }
    config.mcp = {
      ...(config.mcp ?? {}),
      helper: { type: "local", command: ["bun", "run", "--no-install", "mcp_stdio_server.ts"] },
      outside: { type: "remote", url: "http://127.0.0.1:9/mcp" },
    }
  },
})
"""

# Loaded after setup.ts (file name order): sees what setup.ts added, then throws.
STRICT_PLUGIN = """\
export const Strict = async () => ({
  config: async (config: Record<string, any>) => {
    if (!config.agent.reviewer) throw new Error("setup ran first")
    config.agent.reviewer.steps = 3
    throw new Error("no more changes")
  },
})
"""


@pytest.fixture(scope="module")
async def session_id(docker_plane: Plane) -> AsyncIterator[str]:
    files = {
        ".opencode/plugin/setup.ts": SETUP_PLUGIN,
        ".opencode/plugin/strict.ts": STRICT_PLUGIN,
        "mcp_stdio_server.ts": MCP_SERVER_TS,
        "notes.txt": "one\ntwo\n",
    }
    config = {"permission": {"grep": "deny"}}
    session = await docker_plane.client.create_session(workspace_archive=tar_of(files), config_json=json.dumps(config))
    yield session.id
    await docker_plane.client.delete_session(session.id)


async def test_local_servers_a_hook_adds_are_listed_and_its_other_changes_reported(
    docker_plane: Plane, session_id: str,
) -> None:
    listing = await docker_plane.client.list_tools(session_id)
    ids = [t.id for t in listing.tools]
    assert "grep" not in ids  # the session's deny stands although a hook allowed grep
    assert "webfetch" in ids  # a hook's rule is not applied, even a stricter one
    assert [i for i in ids if i.startswith(("helper_", "outside_"))] == [
        "helper_echo", "helper_whoami", "helper_picture", "helper_slow",
    ]
    errors = [(e.origin, e.message) for e in listing.load_errors]
    assert errors == [
        ("/workspace/.opencode/plugin/strict.ts", "config hook: no more changes"),
        (ADOPTION, "permission: changed by a hook; the session's own is kept"),
        (ADOPTION, "agent.reviewer.permission: a hook cannot change an agent's rules; not applied"),
        (ADOPTION, "mcp.outside: only a local server (run in the sandbox) may be added by a hook; not applied"),
    ]


async def test_an_agent_a_hook_adds_can_be_used(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    read = await client.execute_tool(session_id, "read", {"filePath": "/workspace/notes.txt"}, agent="reviewer",
                                     message_id="m1")
    assert "1: one" in read.output
    # Its own rules were not taken: the session's rules and the defaults decide.
    bash = await client.execute_tool(session_id, "bash", {"command": "echo hi", "description": "Echo"},
                                     agent="reviewer", message_id="m2")
    assert bash.output == "hi\n"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.execute_tool(session_id, "read", {"filePath": "/workspace/notes.txt"}, agent="nobody",
                                  message_id="m3")
    assert "unknown agent 'nobody'" in str(info.value.details())


async def test_a_server_a_hook_adds_runs_in_the_sandbox(docker_plane: Plane, session_id: str) -> None:
    outcome = await docker_plane.client.execute_tool(session_id, "helper_echo", {"text": "added by a plugin"},
                                                     message_id="m4")
    assert outcome.output == "added by a plugin"


async def test_a_session_without_config_hooks_keeps_its_config(docker_plane: Plane) -> None:
    client = docker_plane.client
    session = await client.create_session(
        workspace_archive=tar_of({".opencode/plugin/quiet.ts": "export const Quiet = async () => ({})\n"}),
        config_json=json.dumps({"permission": {"grep": "deny"}}),
    )
    try:
        listing = await client.list_tools(session.id)
        ids = [t.id for t in listing.tools]
        assert "grep" not in ids
        assert "webfetch" in ids
        assert "glob" in ids
        assert list(listing.load_errors) == []
    finally:
        await client.delete_session(session.id)
