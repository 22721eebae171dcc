"""The Bun tool host's aborts and timeouts, with real Bun: ctx.abort, cancelled calls, busy loops killed and the
host restarted, a stubborn call abandoned while another runs, an abort during a pending ask."""

from __future__ import annotations

import asyncio
import json

import pytest

from sandbox_agent.custom.host import HostCallError, ToolHost
from tests.unit.custom.bun_host_parts import load
from tests.unit.custom.conftest import Sandbox, eventually, pid_gone


async def test_abort_fires_ctx_abort_without_killing_the_host(sandbox: Sandbox, bun_host: ToolHost) -> None:
    marker = sandbox.root / "aborted.txt"
    path = sandbox.tool("waiter.ts", f"""
        import {{ writeFileSync }} from "node:fs"
        export default {{
          description: "waits", args: {{}},
          async execute(_args, ctx) {{
            ctx.metadata({{ title: "waiting" }})
            await new Promise((resolve) => ctx.abort.addEventListener("abort", resolve))
            writeFileSync({json.dumps(str(marker))}, `${{ctx.abort.aborted}} ${{ctx.abort.reason}}`)
            return "stopped politely"
          }},
        }}
    """)
    await load(bun_host, sandbox, path)
    abort = asyncio.Event()
    call = asyncio.ensure_future(sandbox.call(bun_host, "waiter", {}, abort=abort))
    await eventually(lambda: bool(sandbox.recorder.updates))
    abort.set()
    with pytest.raises(HostCallError, match=r"^Tool execution aborted$"):
        await call
    assert marker.read_text() == "true aborted"
    assert bun_host.restarts == 0


async def test_a_cancelled_call_is_aborted_in_the_host(sandbox: Sandbox, bun_host: ToolHost) -> None:
    marker = sandbox.root / "aborted.txt"
    path = sandbox.tool("waiter.ts", f"""
        import {{ writeFileSync }} from "node:fs"
        export default {{
          description: "waits", args: {{}},
          async execute(_args, ctx) {{
            ctx.metadata({{ title: "waiting" }})
            await new Promise((resolve) => ctx.abort.addEventListener("abort", resolve))
            writeFileSync({json.dumps(str(marker))}, String(ctx.abort.reason))
            return ""
          }},
        }}
    """)
    await load(bun_host, sandbox, path)
    call = asyncio.ensure_future(sandbox.call(bun_host, "waiter", {}))
    await eventually(lambda: bool(sandbox.recorder.updates))
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await eventually(marker.exists)
    assert marker.read_text() == "cancelled"
    await bun_host.ping()
    assert bun_host.restarts == 0


RESTARTED = (r" \(the tool did not stop within 0\.5 s and nothing else was running in the bun tool host, so the "
             r"host was restarted: its tools' module state was reset\)")
"""What the error of an aborted call that took the host down with it adds."""

LOOPER = """
    import { writeFileSync } from "node:fs"
    export const loop = {
      description: "never yields", args: {},
      async execute(_args, ctx) { writeFileSync(ctx.extra.pidfile, String(process.pid)); while (true) {} },
    }
    export const quick = { description: "quick", args: {}, async execute() { return "still here" } }
"""


async def test_busy_loop_is_killed_on_abort_and_the_next_call_works(sandbox: Sandbox, bun_host: ToolHost) -> None:
    await load(bun_host, sandbox, sandbox.tool("looper.ts", LOOPER))
    pidfile = sandbox.root / "pid"
    abort = asyncio.Event()
    context_call = bun_host.call(
        "looper_loop", {}, sandbox.context(pidfile=str(pidfile)), on_metadata=sandbox.recorder.on_metadata,
        on_ask=sandbox.recorder.on_ask, abort=abort, timeout_s=None,
    )
    call = asyncio.ensure_future(context_call)
    await eventually(lambda: pidfile.exists() and pidfile.read_text() != "")
    abort.set()
    with pytest.raises(HostCallError, match=r"^Tool execution aborted" + RESTARTED + "$"):
        await call
    assert pid_gone(int(pidfile.read_text()))
    assert (await sandbox.call(bun_host, "looper_quick", {})).output == "still here"
    assert bun_host.restarts == 1


async def test_busy_loop_is_killed_on_timeout(sandbox: Sandbox, bun_host: ToolHost) -> None:
    await load(bun_host, sandbox, sandbox.tool("looper.ts", LOOPER))
    pidfile = sandbox.root / "pid"
    with pytest.raises(HostCallError, match=r"^Tool execution timed out after 0\.3 s" + RESTARTED + "$"):
        await bun_host.call("looper_loop", {}, sandbox.context(pidfile=str(pidfile)),
                            on_metadata=sandbox.recorder.on_metadata, on_ask=sandbox.recorder.on_ask,
                            abort=asyncio.Event(), timeout_s=0.3)
    assert pid_gone(int(pidfile.read_text()))
    assert (await sandbox.call(bun_host, "looper_quick", {})).output == "still here"


async def test_a_stubborn_call_is_abandoned_while_another_runs(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("state.ts", """
        let counter = 0
        export const count = { description: "counts", args: {}, async execute() { return String(++counter) } }
        export const stubborn = {
          description: "ignores abort", args: {},
          async execute(_args, ctx) { ctx.metadata({ title: "stubborn" }); await Bun.sleep(1500); return "late" },
        }
        export const patient = {
          description: "waits", args: {},
          async execute() { await Bun.sleep(800); return `patient ${counter}` },
        }
    """)
    await load(bun_host, sandbox, path)
    assert (await sandbox.call(bun_host, "state_count", {})).output == "1"
    patient = asyncio.ensure_future(sandbox.call(bun_host, "state_patient", {}))
    abort = asyncio.Event()
    stubborn = asyncio.ensure_future(sandbox.call(bun_host, "state_stubborn", {}, abort=abort))
    await eventually(lambda: bool(sandbox.recorder.updates))
    abort.set()
    with pytest.raises(HostCallError, match=r"^Tool execution aborted$"):
        await asyncio.wait_for(stubborn, 0.4)  # at once, not after the grace
    assert (await patient).output == "patient 1"
    assert (await sandbox.call(bun_host, "state_count", {})).output == "2"
    await asyncio.sleep(1.0)  # the abandoned call's late result arrives and is dropped
    assert (await sandbox.call(bun_host, "state_count", {})).output == "3"
    assert bun_host.restarts == 0


async def test_abort_while_an_ask_is_pending_ends_the_call(sandbox: Sandbox, bun_host: ToolHost) -> None:
    path = sandbox.tool("asker.ts", """
        export default {
          description: "asks", args: {},
          async execute(_args, ctx) {
            await ctx.ask({ permission: "x", patterns: [], always: [], metadata: {} })
            return ""
          },
        }
    """)
    await load(bun_host, sandbox, path)
    answered = asyncio.Event()

    async def never_answers(*_: object) -> None:
        answered.set()
        await asyncio.Event().wait()

    abort = asyncio.Event()
    call = asyncio.ensure_future(bun_host.call("asker", {}, sandbox.context(), on_metadata=sandbox.recorder.on_metadata,
                                               on_ask=never_answers, abort=abort, timeout_s=None))
    await answered.wait()
    abort.set()
    with pytest.raises(HostCallError, match=r"^Tool execution aborted$"):
        await call
    assert bun_host.restarts == 0  # the pending ask was rejected, the call ended, nothing was killed
