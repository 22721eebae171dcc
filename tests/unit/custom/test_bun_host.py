"""The Bun tool host and its driver, with real Bun, zod and @opencode-ai/plugin (no mocks): ids, schemas,
validation, the context, asks, loading, result shapes, reloads, concurrency and restarts.

Aborts and timeouts are in test_bun_host_abort.py, plugins in test_bun_host_plugins.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from sandbox_agent.custom.host import HostCallError, HostFile, ToolHost
from tests.unit.custom.bun_host_parts import RETRY, SCHEMA, load
from tests.unit.custom.conftest import Sandbox, eventually, pid_gone

MATH = """
    import { tool } from "@opencode-ai/plugin"
    import { z } from "zod"
    export const zeta = tool({ description: "last", args: {}, async execute() { return "z" } })
    export default tool({
      description: "Adds two numbers",
      args: { a: z.number().describe("first"), b: tool.schema.number().default(2) },
      async execute(args) { return String(args.a + args.b) },
    })
    export const Multiply = tool({
      description: "Multiplies",
      args: z.object({ a: z.number(), mode: z.enum(["fast", "exact"]).optional(), tags: z.array(z.string()) }),
      async execute(args) { return String(args.a * 2) },
    })
    export const add = tool({
      description: "add", args: { n: z.coerce.number() }, async execute(a) { return JSON.stringify(a) },
    })
"""


async def test_ids_follow_sorted_export_names_and_schemas_are_zods(sandbox: Sandbox, bun_host: ToolHost) -> None:
    tools = await load(bun_host, sandbox, sandbox.tool("math.ts", MATH))
    assert [t.id for t in tools] == ["math_Multiply", "math_add", "math", "math_zeta"]
    by_id = {t.id: t for t in tools}
    assert by_id["math"].parameters == {
        "$schema": SCHEMA, "type": "object",
        "properties": {"a": {"description": "first", "type": "number"}, "b": {"default": 2, "type": "number"}},
        "required": ["a", "b"], "additionalProperties": False,
    }
    assert by_id["math_Multiply"].parameters == {
        "$schema": SCHEMA, "type": "object",
        "properties": {
            "a": {"type": "number"}, "mode": {"type": "string", "enum": ["fast", "exact"]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["a", "tags"], "additionalProperties": False,
    }
    assert by_id["math_zeta"].parameters == {"$schema": SCHEMA, "type": "object", "properties": {},
                                             "additionalProperties": False}
    assert by_id["math"].description == "Adds two numbers"
    assert {t.source for t in tools} == {"CUSTOM"}
    assert {t.origin for t in tools} == {str(sandbox.tools / "math.ts")}
    assert all(0 < t.init_ms < 5000 for t in tools)


async def test_invalid_arguments_get_zods_own_message(sandbox: Sandbox, bun_host: ToolHost) -> None:
    await load(bun_host, sandbox, sandbox.tool("math.ts", MATH))
    with pytest.raises(HostCallError) as caught:
        await sandbox.call(bun_host, "math_Multiply", {"a": "x", "mode": "slow"})
    issues = [
        {"expected": "number", "code": "invalid_type", "path": ["a"],
         "message": "Invalid input: expected number, received string"},
        {"code": "invalid_value", "values": ["fast", "exact"], "path": ["mode"],
         "message": 'Invalid option: expected one of "fast"|"exact"'},
        {"expected": "array", "code": "invalid_type", "path": ["tags"],
         "message": "Invalid input: expected array, received undefined"},
    ]
    expected = f"The math_Multiply tool was called with invalid arguments: {json.dumps(issues, indent=2)}.{RETRY}"
    assert str(caught.value) == expected


async def test_execute_gets_parsed_args_with_undeclared_keys_kept(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("echo.ts", """
        import { tool } from "@opencode-ai/plugin"
        export default tool({
          description: "echo",
          args: {
            n: tool.schema.coerce.number(), d: tool.schema.string().default("dflt"), o: tool.schema.string().optional(),
          },
          async execute(args) { return JSON.stringify(args) },
        })
    """)
    await load(bun_host, sandbox, path)
    result = await sandbox.call(bun_host, "echo", {"n": "41", "extra": {"k": [1]}})
    assert json.loads(result.output) == {"n": 41, "d": "dflt", "extra": {"k": [1]}}
    result = await sandbox.call(bun_host, "echo", {"n": 1, "d": "given", "o": "x"})
    assert json.loads(result.output) == {"n": 1, "d": "given", "o": "x"}


async def test_context_fields_and_metadata_updates(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("ctx.ts", """
        export default {
          description: "ctx", args: {},
          async execute(_args, ctx) {
            ctx.metadata({ title: "working" })
            ctx.metadata({ metadata: { step: 1 } })
            await ctx.metadata({ title: "both", metadata: { step: 2 } })
            const { sessionID, messageID, agent, callID, directory, worktree, extra } = ctx
            return JSON.stringify({ sessionID, messageID, agent, callID, directory, worktree, extra,
                                    aborted: ctx.abort.aborted, cwd: process.cwd() })
          },
        }
    """)
    await load(bun_host, sandbox, path)
    result = await sandbox.call(bun_host, "ctx", {})
    project = str(sandbox.project)
    assert json.loads(result.output) == {
        "sessionID": "ses_1", "messageID": "msg_1", "agent": "build", "callID": "call_1", "directory": project,
        "worktree": project, "extra": {}, "aborted": False, "cwd": project,
    }
    assert sandbox.recorder.updates == [("working", None), (None, {"step": 1}), ("both", {"step": 2})]


ASKER = """
    export const plain = {
      description: "asks", args: {},
      async execute(_args, ctx) {
        await ctx.ask({ permission: "edit", patterns: ["a.txt"], always: ["*"], metadata: { diff: "+x" } })
        return "allowed"
      },
    }
    export const careful = {
      description: "asks and catches", args: {},
      async execute(_args, ctx) {
        try { await ctx.ask({ permission: "bash", patterns: ["rm -rf /"], always: [], metadata: {} }) }
        catch (error) { return `refused: ${error.message} (${error instanceof Error})` }
        return "allowed"
      },
    }
"""


async def test_ask_allowed_and_denied(sandbox: Sandbox, bun_host: ToolHost) -> None:
    tools = await load(bun_host, sandbox, sandbox.tool("asker.ts", ASKER))
    assert [t.id for t in tools] == ["asker_careful", "asker_plain"]
    result = await sandbox.call(bun_host, "asker_plain", {})
    assert result.output == "allowed"
    assert sandbox.recorder.asks == [("edit", ["a.txt"], ["*"], {"diff": "+x"})]
    sandbox.recorder.deny = {"edit": "The user rejected permission to use this specific tool call.",
                             "bash": "no shells today"}
    with pytest.raises(HostCallError, match=r"^The user rejected permission to use this specific tool call\.$"):
        await sandbox.call(bun_host, "asker_plain", {})
    result = await sandbox.call(bun_host, "asker_careful", {})
    assert result.output == "refused: no shells today (true)"


async def test_a_broken_file_is_a_load_error_and_its_neighbours_load(sandbox: Sandbox, bun_host: ToolHost) -> None:
    bad = sandbox.tool("bad.ts", 'export default {\n  description: "x",,\n}\n')
    missing = sandbox.tool("missing.ts", 'import "left-pad-that-is-not-installed"\nexport default 1\n')
    weird = sandbox.tool("weird.ts", """
        export default { description: "not zod", args: { a: "string" }, async execute() { return "" } }
        export const fine = { description: "fine", args: {}, async execute() { return "fine" } }
    """)
    good = sandbox.tool("good.ts", 'export default { description: "good", args: {}, execute: () => "ok" }\n')
    loaded = await bun_host.load([HostFile(p, "tool") for p in (bad, missing, weird, good)], str(sandbox.project), "/")
    assert [t.id for t in loaded.tools] == ["weird_fine", "good"]
    assert [e.origin for e in loaded.load_errors] == [bad, missing, weird]
    assert loaded.load_errors[0].message == (
        f'2 errors building "{bad}": Expected identifier but found "," ({bad}:2:20); '
        f'Expected "}}" but found end of file ({bad}:3:2)'
    )
    assert loaded.load_errors[1].message.startswith("Cannot find package 'left-pad-that-is-not-installed'")
    assert loaded.load_errors[2].message == "tool weird: args.a is not a zod schema"
    assert (await sandbox.call(bun_host, "good", {})).output == "ok"


async def test_sibling_imports_and_the_tool_subpath(sandbox: Sandbox, bun_host: ToolHost) -> None:
    sandbox.tool("util.ts", 'export const shout = (s: string): string => s.toUpperCase() + "!"\n')
    sandbox.tool("lib/format.ts", 'export const wrap = (s: string): string => `[${s}]`\n')
    path = sandbox.tool("greet.ts", """
        import { tool } from "@opencode-ai/plugin/tool"
        import { shout } from "./util.js"
        import { wrap } from "./lib/format"
        import { Database } from "bun:sqlite"
        export default tool({
          description: "greets",
          args: { name: tool.schema.string() },
          async execute(args) {
            const db = new Database(":memory:")
            const row = db.query("select 40 + 2 as n").get() as { n: number }
            return wrap(shout(`hi ${args.name}`)) + " " + row.n
          },
        })
    """)
    await load(bun_host, sandbox, path)
    assert (await sandbox.call(bun_host, "greet", {"name": "ann"})).output == "[HI ANN!] 42"


async def test_result_shapes_are_normalised(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("shapes.ts", """
        const def = (value: unknown) => ({ description: "shape", args: {}, async execute() { return value } })
        export const text = def("plain")
        export const full = def({ title: "T", output: "out", metadata: { n: 1 },
                                  attachments: [{ type: "file", mime: "image/png", url: "data:image/png;base64,AA==",
                                                  filename: "a.png" }] })
        export const bare = def({ output: "only output" })
        export const object = def({ answer: 42, list: [1, "two"] })
        export const number = def(42)
        export const boolean = def(true)
        export const nothing = def(undefined)
        export const nil = def(null)
        export const big = def(10n)
        const loop: any = {}
        loop.self = loop
        export const circular = def(loop)
    """)
    await load(bun_host, sandbox, path)

    async def shape(tool: str) -> tuple[str, str, dict[str, object], list[dict[str, str]]]:
        r = await sandbox.call(bun_host, f"shapes_{tool}", {})
        return r.title, r.output, r.metadata, r.attachments

    assert await shape("text") == ("", "plain", {}, [])
    assert await shape("full") == ("T", "out", {"n": 1}, [
        {"mime": "image/png", "url": "data:image/png;base64,AA==", "filename": "a.png"}])
    assert await shape("bare") == ("", "only output", {}, [])
    assert await shape("object") == ("", '{"answer":42,"list":[1,"two"]}', {}, [])
    assert await shape("number") == ("", "42", {}, [])
    assert await shape("boolean") == ("", "true", {}, [])
    assert await shape("nothing") == ("", "", {}, [])
    assert await shape("nil") == ("", "null", {}, [])
    assert await shape("big") == ("", "10", {}, [])
    assert await shape("circular") == ("", "[object Object]", {}, [])


async def test_non_tool_exports_are_skipped_with_a_note(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("mixed.ts", """
        export const helper = (x: number) => x * 2
        export const LIMIT = 10
        export const half = { description: "half", args: {} }
        export const real = { description: "real", args: {}, async execute() { return String(helper(2)) } }
    """)
    loaded = await bun_host.load([HostFile(path, "tool")], str(sandbox.project), "/")
    assert [t.id for t in loaded.tools] == ["mixed_real"]
    assert [(n.origin, n.message) for n in loaded.notes] == [
        (path, "export LIMIT is not a tool definition (a number); skipped"),
        (path, "export half is not a tool definition (no execute function); skipped"),
        (path, "export helper is not a tool definition (a function); skipped"),
    ]
    assert loaded.load_errors == []


async def test_same_definition_exported_twice_gives_two_ids(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("twice.ts", """
        const t = { description: "twice", args: {}, async execute(_a: unknown, ctx: any) { return "ran" } }
        export const again = t
        export default t
    """)
    assert [t.id for t in await load(bun_host, sandbox, path)] == ["twice_again", "twice"]
    assert (await sandbox.call(bun_host, "twice_again", {})).output == "ran"


async def test_printing_does_not_break_the_protocol(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("noisy.ts", """
        console.log("printed at import")
        export default {
          description: "noisy", args: {},
          async execute() {
            console.log('{"id":"1","type":"result","title":"","output":"forged","metadata":{},"attachments":[]}')
            console.info("info")
            process.stdout.write("no newline")
            await Bun.write(Bun.stdout, "bun stdout\\n")
            Bun.spawnSync(["echo", "child output"], { stdout: "inherit" })
            return "clean"
          },
        }
    """)
    await load(bun_host, sandbox, path)
    for _ in range(3):
        assert (await sandbox.call(bun_host, "noisy", {})).output == "clean"


async def test_process_exit_in_a_tool_does_not_end_the_host(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("quitter.ts", """
        export default { description: "quits", args: {}, async execute() { process.exit(3) } }
    """)
    await load(bun_host, sandbox, path)
    with pytest.raises(HostCallError, match=r"^process\.exit\(3\) is not allowed in a tool$"):
        await sandbox.call(bun_host, "quitter", {})
    assert bun_host.restarts == 0


async def test_reload_imports_only_changed_files(sandbox: Sandbox, bun_host: ToolHost) -> None:
    log = sandbox.root / "imports.log"

    def source(name: str, version: str) -> str:
        return f"""
            import {{ appendFileSync }} from "node:fs"
            appendFileSync({json.dumps(str(log))}, "{name}\\n")
            export default {{ description: "{name} {version}", args: {{}}, async execute() {{ return "{version}" }} }}
        """

    a = sandbox.tool("a.ts", source("a", "v1"))
    b = sandbox.tool("b.ts", source("b", "v1"))
    gone = sandbox.tool("gone.ts", source("gone", "v1"))
    first = await load(bun_host, sandbox, a, b, gone)
    assert [t.id for t in first] == ["a", "b", "gone"]
    sandbox.tool("b.ts", source("b", "version-2"))
    second = await load(bun_host, sandbox, a, b)
    assert [(t.id, t.description) for t in second] == [("a", "a v1"), ("b", "b version-2")]
    assert second[0].init_ms == first[0].init_ms  # the same import, not a new one
    assert log.read_text().split() == ["a", "b", "gone", "b"]
    assert (await sandbox.call(bun_host, "b", {})).output == "version-2"
    with pytest.raises(HostCallError, match=r"^Unknown tool: gone$"):
        await sandbox.call(bun_host, "gone", {})


async def test_concurrent_calls_share_one_host(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("sleepy.ts", """
        export const nap = {
          description: "sleeps", args: {},
          async execute(_a: unknown, ctx: any) { await Bun.sleep(ctx.extra.ms); return `slept ${ctx.extra.ms}` },
        }
    """)
    await load(bun_host, sandbox, path)

    async def nap(ms: int) -> str:
        result = await bun_host.call("sleepy_nap", {}, sandbox.context(ms=ms), on_metadata=sandbox.recorder.on_metadata,
                                     on_ask=sandbox.recorder.on_ask, abort=asyncio.Event(), timeout_s=10)
        return result.output

    assert list(await asyncio.gather(nap(300), nap(10), nap(100))) == ["slept 300", "slept 10", "slept 100"]
    await bun_host.ping()


async def test_a_dead_host_is_restarted_and_reloaded(sandbox: Sandbox, bun_host: ToolHost) -> None:
    pidfile = sandbox.root / "pid"
    path = sandbox.tool("pid.ts", f"""
        import {{ writeFileSync }} from "node:fs"
        writeFileSync({json.dumps(str(pidfile))}, String(process.pid))
        export default {{ description: "pid", args: {{}}, async execute() {{ return String(process.pid) }} }}
    """)
    await load(bun_host, sandbox, path)
    first = int((await sandbox.call(bun_host, "pid", {})).output)
    os.kill(first, signal.SIGKILL)
    await eventually(lambda: pid_gone(first))
    second = int((await sandbox.call(bun_host, "pid", {})).output)
    assert second != first
    assert int(pidfile.read_text()) == second  # the file was imported again by the new host
    assert bun_host.restarts == 1
