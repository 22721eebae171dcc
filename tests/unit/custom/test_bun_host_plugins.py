"""Plugins in the Bun tool host, with real Bun and @opencode-ai/plugin: their tools and hooks in load order,
load errors, config hooks, and the SDK client they are given."""

from __future__ import annotations

import json

import pytest

from sandbox_agent.custom.host import HostCallError, HostFile, ToolHost
from tests.unit.custom.bun_host_parts import SCHEMA
from tests.unit.custom.conftest import Sandbox

PLUGIN = """
    import type { Plugin } from "@opencode-ai/plugin"
    import { tool } from "@opencode-ai/plugin"
    export const Guard: Plugin = async ({ directory, worktree, project, serverUrl, client, $ }) => {
      const who = (await $`pwd`.text()).trim()
      return {
        tool: {
          where: tool({
            description: "where the plugin runs",
            args: { verbose: tool.schema.boolean().optional() },
            async execute(args) {
              return JSON.stringify({ directory, worktree, project, serverUrl: String(serverUrl),
                                      client: typeof client?.app?.log === "function", who, args })
            },
          }),
        },
        "tool.execute.before": async (input: any, output: any) => {
          if (input.tool === "where") output.args.verbose = true
          if (input.tool === "forbidden") throw new Error("not on my watch")
        },
        "tool.execute.after": async (input: any, output: any) => { output.title = `after ${input.tool}` },
      }
    }
    export const Again = Guard
    export const Second = async () => ({
      "tool.execute.before": async (input: any, output: any) => {
        output.args.seen = [...(output.args.seen ?? []), "second"]
      },
    })
    export const version = "1.0"
"""


async def test_plugin_tools_join_and_hooks_run_in_load_order(sandbox: Sandbox, bun_host: ToolHost) -> None:
    plugin = sandbox.write(".opencode/plugin/guard.ts", PLUGIN)
    custom = sandbox.tool("zz.ts", 'export default { description: "zz", args: {}, async execute() { return "" } }\n')
    loaded = await bun_host.load([HostFile(plugin, "plugin"), HostFile(custom, "tool")], str(sandbox.project), "/wt")
    assert [(t.id, t.source, t.origin) for t in loaded.tools] == [("zz", "CUSTOM", custom), ("where", "PLUGIN", plugin)]
    assert loaded.tools[1].parameters == {
        "$schema": SCHEMA, "type": "object", "properties": {"verbose": {"type": "boolean"}},
        "additionalProperties": False,
    }
    assert loaded.hooks == ["tool.execute.after", "tool.execute.before"]
    assert [n.message for n in loaded.notes] == ["export version is not a plugin function; skipped"]

    before = await bun_host.hook("tool.execute.before", {"tool": "where", "sessionID": "s", "callID": "c"},
                                 {"args": {"verbose": False}}, timeout_s=10)
    assert before == {"args": {"verbose": True, "seen": ["second"]}}  # Guard once (deduped), then Second
    result = await sandbox.call(bun_host, "where", before["args"])
    assert json.loads(result.output) == {
        "directory": str(sandbox.project), "worktree": "/wt", "project": {"id": "sandbox", "worktree": "/wt"},
        "serverUrl": "http://localhost:0/", "client": True, "who": str(sandbox.project),
        "args": {"verbose": True, "seen": ["second"]},
    }
    after = await bun_host.hook("tool.execute.after", {"tool": "where", "sessionID": "s", "callID": "c", "args": {}},
                                {"title": "", "output": "o", "metadata": {}}, timeout_s=10)
    assert after == {"title": "after where", "output": "o", "metadata": {}}
    with pytest.raises(HostCallError) as caught:
        await bun_host.hook("tool.execute.before", {"tool": "forbidden"}, {"args": {}}, timeout_s=10)
    assert str(caught.value) == "not on my watch"  # the hook's own message, as upstream lets it through


async def test_a_throwing_plugin_is_a_load_error(sandbox: Sandbox, bun_host: ToolHost) -> None:
    broken = sandbox.write(".opencode/plugin/broken.ts", """
        export const Broken = async () => { throw new Error("cannot start") }
        export const Fine = async () => ({ tool: { ok: { description: "ok", args: {}, execute: () => "ok" } } })
    """)
    loaded = await bun_host.load([HostFile(broken, "plugin")], str(sandbox.project), "/")
    assert [(e.origin, e.message) for e in loaded.load_errors] == [(broken, "plugin Broken: cannot start")]
    assert [t.id for t in loaded.tools] == ["ok"]
    assert loaded.hooks == []


async def test_config_hooks_run_in_load_order_on_a_copy_of_the_sessions_config(
    sandbox: Sandbox, bun_host: ToolHost,
) -> None:
    first = sandbox.write(".opencode/plugin/a.ts", """
        export const A = async () => ({ config: async (config: any) => {
          config.agent.helper = { description: "Helps", mode: "subagent" }
          config.seen = [...(config.seen ?? []), "a"]
        } })
    """)
    second = sandbox.write(".opencode/plugin/b.ts", """
        export const B = async () => ({ config(config: any) { config.seen.push("b"); throw new Error("enough") } })
    """)
    files = [HostFile(first, "plugin"), HostFile(second, "plugin")]
    session = {"permission": {"bash": "ask"}, "mode": {"old": {}}}
    loaded = await bun_host.load(files, str(sandbox.project), "/", session)
    assert json.loads(loaded.config_json) == {
        "permission": {"bash": "ask"}, "mode": {"old": {}}, "agent": {"helper": {"description": "Helps",
                                                                                 "mode": "subagent"}},
        "plugin": [], "seen": ["a", "b"],
    }
    assert [(e.origin, e.message) for e in loaded.load_errors] == [(second, "config hook: enough")]
    assert session == {"permission": {"bash": "ask"}, "mode": {"old": {}}}  # the hooks worked on a copy

    again = await bun_host.load(files, str(sandbox.project), "/", session)  # each load starts from the session's
    assert json.loads(again.config_json)["seen"] == ["a", "b"]


async def test_no_config_hook_no_config_and_an_oversized_one_is_not_kept(sandbox: Sandbox, bun_host: ToolHost) -> None:
    quiet = sandbox.write(".opencode/plugin/quiet.ts", "export const Quiet = async () => ({})\n")
    loaded = await bun_host.load([HostFile(quiet, "plugin")], str(sandbox.project), "/", {"x": 1})
    assert loaded.config_json == ""
    big = sandbox.write(".opencode/plugin/big.ts", """
        export const Big = async () => ({ config: async (config: any) => { config.blob = "x".repeat(2 ** 21) } })
    """)
    loaded = await bun_host.load([HostFile(big, "plugin")], str(sandbox.project), "/", {})
    assert loaded.config_json == ""
    assert [(e.origin, e.message) for e in loaded.load_errors] == [
        (big, "config hook: the config cannot be kept: it is larger than 1048576 characters"),
    ]


LOGGING_PLUGIN = """
    export const Logged = async ({ client }) => {
      await client.app.log({ body: { service: "logged", level: "info", message: "ready" } })
      await client.tui.showToast({ body: { message: "hello", variant: "info" } })
      return {
        tool: {
          sessions: {
            description: "asks the server for its sessions",
            args: {},
            async execute() {
              const answer = await client.session.list()
              let thrown = ""
              try { await client.session.list({ throwOnError: true }) } catch (error) { thrown = error.message }
              return JSON.stringify({ data: answer.data ?? null, error: answer.error, thrown })
            },
          },
        },
      }
    }
"""


async def test_plugins_get_an_sdk_client_that_logs_and_refuses_the_rest(sandbox: Sandbox,
                                                                          bun_host: ToolHost) -> None:
    plugin = sandbox.write(".opencode/plugin/logged.js", LOGGING_PLUGIN)
    loaded = await bun_host.load([HostFile(plugin, "plugin")], str(sandbox.project), str(sandbox.project))
    assert (list(loaded.load_errors), [t.id for t in loaded.tools]) == ([], ["sessions"])
    refused = "the OpenCode server API is not available to plugins in the sandbox (GET /session)"
    assert json.loads((await sandbox.call(bun_host, "sessions", {})).output) == {
        "data": None, "error": {"name": "UnknownError", "data": {"message": refused}}, "thrown": refused,
    }
