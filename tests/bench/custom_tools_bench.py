"""Custom TypeScript tools in a real Docker sandbox: 20-tool ListTools (cold and repeated) and a call's p50
beside a fresh `bun run` per call in the same container.

Rows (wall clock seen by the public-API client, in-process control plane on loopback, one Docker sandbox
per session):

* ``ListTools, 20 TS tools (cold)`` -- the first ListTools of a fresh session whose workspace holds 20 tool
  files: scan, 20 imports and schema conversions, and what is left of the Bun host's start, which begins when
  the session's code snapshot is taken at create. One sample per session; the warm pool is refilled
  (untimed) before each sample so that no container start competes for the CPUs.
* ``ListTools, 20 TS tools (repeated)`` -- the same session listed again (re-scan, nothing changed).
* ``custom tool call`` -- ExecuteTool of one of those tools (client -> control plane -> agent -> Bun host).
* Baseline ``fresh bun run per call`` -- the same tool run by a new `bun --no-install run once.ts` per call,
  started by the agent (SandboxService.Exec) in the same container; ``agent exec true`` is that path's
  own cost, so ``bun alone`` is the difference.
* ``diag:`` rows split a call and a listing: straight to the session's agent (RunTool, ListCustomTools, no
  public API), a call that never leaves the control plane (`invalid`), and the Bun host alone driven over its
  pipes by a Python process in the sandbox (no agent at all).
* ``stage:`` rows break the cold listing down inside the sandbox: the Bun host's start and its load of the
  20 files, and one fresh Bun process's runtime start, import of @opencode-ai/plugin and zod, and import of
  the 20 files with their schema conversion.

Targets (DESIGN §10, issue: tools that start fast): cold 20-tool ListTools <= 300 ms; custom tool call p50 <= 5 ms;
the Bun host's first start (exec to its first pong) <= 150 ms. The Python host's rows: python_tools_bench.py.
Run alone: ``.venv/bin/python -m tests.bench.custom_tools_bench [--quick]``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from controlplane.client import AsyncClient
from controlplane.core.seam.messages import BuiltinCall, RunAsk, RunFailed, RunResult
from controlplane.core.seam.provider import SandboxAgent
from tests.archives import tar_of
from tests.bench.bench_plane import run_alone
from tests.planes import Plane, running_plane

TOOLS = 20
COLD_TARGET_MS = 300.0
BUN_START_TARGET_MS = 150.0
CALL_TARGET_MS = 5.0
BUN = "/usr/local/bin/bun"
STEP_TIMEOUT_S = 60.0
"""A stuck step fails the benchmark instead of hanging it."""
BUN_ENV = {"HOME": "/tmp/home", "NO_COLOR": "1"}

TOOL_TS = """import {{ tool }} from "@opencode-ai/plugin"

export default tool({{
  description: "Bench tool {i}: doubles a number and labels it",
  args: {{
    n: tool.schema.number().describe("the number"),
    label: tool.schema.string().default("t{i}").describe("a label"),
  }},
  async execute(args, ctx) {{
    return `${{args.label}} ${{args.n * 2}} ${{ctx.agent}}`
  }},
}})
"""
# A fresh runtime doing what one call needs: import the file, validate with zod, execute, print.
ONCE_TS = """import { z } from "zod"

const [path, raw] = process.argv.slice(2)
const definition = (await import(path)).default
const args = z.object(definition.args).parse(JSON.parse(raw))
process.stdout.write(await definition.execute(args, { agent: "build", abort: new AbortController().signal }))
"""
# Stage timings of a cold listing, from one fresh process (performance.now() counts from process start).
STAGES_TS = """import { readdirSync } from "node:fs"
const started = performance.now()
const { z } = await import("zod")
await import("@opencode-ai/plugin")
const packages = performance.now()
const dir = "/workspace/.opencode/tool"
for (const name of readdirSync(dir).sort()) {
  const definition = (await import(`${dir}/${name}`)).default
  z.toJSONSchema(z.object(definition.args))
}
const files = performance.now()
process.stdout.write(JSON.stringify({ runtime: started, packages: packages - started, files: files - packages }))
"""

# The Bun host alone, driven over its pipes by a Python process in the sandbox: the protocol round trip of a
# call without the agent's gRPC server or anything above it.
HOST_RTT_PY = """import glob, json, subprocess, sys, time

tool, n = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
host = subprocess.Popen([sys.argv[3], "--no-install", "run", "/opt/agent/toolhost/host.ts"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def ask(message):
    host.stdin.write((json.dumps(message) + "\\n").encode())
    host.stdin.flush()
    while True:
        reply = json.loads(host.stdout.readline())
        if reply.get("id") == message["id"] and reply.get("type") not in ("metadata", "ask"):
            return reply


ask({"id": "ping", "type": "ping"})
start_ms = (time.perf_counter() - started) * 1000
started = time.perf_counter()
files = sorted(glob.glob("/workspace/.opencode/tool/*.ts"))
loaded = ask({"id": "load", "type": "load", "directory": "/workspace", "worktree": "/",
              "files": [{"path": path, "kind": "tool"} for path in files]})
load_ms = (time.perf_counter() - started) * 1000
assert len(loaded["tools"]) == len(files), loaded
samples = []
for i in range(n):
    started = time.perf_counter()
    reply = ask({"id": str(i), "type": "call", "tool": tool, "args": {"n": 21},
                 "context": {"agent": "build", "directory": "/workspace", "worktree": "/"}})
    samples.append((time.perf_counter() - started) * 1000)
    assert reply["type"] == "result", reply
host.stdin.close()
host.wait()
print(json.dumps({"start_ms": start_ms, "load_ms": load_ms, "call_ms": samples}))
"""


def workspace() -> bytes:
    files = {f".opencode/tool/t{i:02d}.ts": TOOL_TS.format(i=f"{i:02d}") for i in range(TOOLS)}
    files["bench/once.ts"] = ONCE_TS
    files["bench/stages.ts"] = STAGES_TS
    files["bench/host_rtt.py"] = HOST_RTT_PY
    return tar_of(files)


@dataclass
class Row:
    name: str
    samples_ms: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def p99(self) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")

    def line(self) -> str:
        s = self.samples_ms
        cells = " ".join(f"{v:>9.2f}" for v in (self.p50, self.p99, min(s), max(s)))
        return f"  {self.name:<50} {len(s):>4} {cells}"


async def timed(n: int, work: Callable[[], Awaitable[object]]) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await asyncio.wait_for(work(), STEP_TIMEOUT_S)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def wait_pool_full(plane: Plane) -> None:
    provider = plane.plane.sessions._provider
    deadline = time.monotonic() + 120
    while True:
        stats = provider.pool_stats()
        if stats.ready >= stats.target and stats.creating == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool did not refill: {stats}")
        await asyncio.sleep(0.02)


async def cold_listing(plane: Plane) -> tuple[float, float, int]:
    """(ms of the first ListTools of a new session, sum of the tools' init_ms, custom tools listed)."""
    session = await plane.client.create_session(workspace_archive=workspace())
    try:
        await wait_pool_full(plane)
        started = time.perf_counter()
        listing = await asyncio.wait_for(plane.client.list_tools(session.id), STEP_TIMEOUT_S)
        elapsed = (time.perf_counter() - started) * 1000
    finally:
        await plane.client.delete_session(session.id)
    custom = [t for t in listing.tools if t.id.startswith("t") and t.origin.startswith("/workspace/.opencode")]
    if listing.load_errors:
        raise RuntimeError(f"tools failed to load: {list(listing.load_errors)}")
    return elapsed, sum(t.init_ms for t in custom), len(custom)


async def cold_agent_listing(plane: Plane) -> float:
    """ms of the first ListCustomTools asked straight of a new session's agent (no public API, no built-ins)."""
    session = await plane.client.create_session(workspace_archive=workspace())
    try:
        await wait_pool_full(plane)
        agent = (await plane.plane.sessions._provider.get(session.sandbox_id)).agent
        started = time.perf_counter()
        await asyncio.wait_for(agent.list_custom_tools("{}", {}), STEP_TIMEOUT_S)
        return (time.perf_counter() - started) * 1000
    finally:
        await plane.client.delete_session(session.id)



async def run_on_agent(agent: SandboxAgent, tool: str, args: dict[str, object], session_id: str) -> None:
    """One RunTool straight to the session's agent over its socket: the call minus the public API."""
    call = BuiltinCall(tool=tool, args=args, session_id=session_id, message_id="m", call_id="bench", agent="build",
                       custom=tool != "read")
    run = await agent.run_builtin(call)
    async for event in run.events():
        if isinstance(event, RunAsk):  # the control plane's permission check, which this path skips
            await run.answer(event.ask_id, True)
        elif isinstance(event, RunFailed):
            raise RuntimeError(f"agent RunTool {tool} failed: {event.message}")
        elif isinstance(event, RunResult):
            return


async def run_ok(client: AsyncClient, session_id: str, argv: list[str]) -> str:
    done = await client.run(session_id, argv, env=BUN_ENV, cwd="/workspace")
    if done.exit_code != 0:
        raise RuntimeError(f"{argv} failed ({done.exit_code}): {done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout.decode()


async def measure(plane: Plane, quick: bool) -> tuple[dict[str, Row], list[str]]:
    cold_n, list_n, call_n, fresh_n = (2, 20, 100, 5) if quick else (5, 100, 300, 20)
    rows: dict[str, Row] = {}
    notes: list[str] = []

    cold = [await cold_listing(plane) for _ in range(cold_n)]
    rows["cold"] = Row(f"ListTools, {TOOLS} TS tools (cold)", [c[0] for c in cold])
    rows["cold_agent"] = Row("diag: agent ListCustomTools (cold)", [await cold_agent_listing(plane)
                                                                     for _ in range(cold_n)])
    notes.append(f"custom tools listed: {cold[0][2]}; their init_ms summed (host side): "
                 f"{statistics.median(c[1] for c in cold):.1f} ms")

    client = plane.client
    session = await client.create_session(workspace_archive=workspace())
    try:
        await wait_pool_full(plane)
        await client.list_tools(session.id)
        rows["repeated"] = Row(f"ListTools, {TOOLS} TS tools (repeated)",
                               await timed(list_n, lambda: client.list_tools(session.id)))

        expected = "t07 42 build"
        # A message id per call, as each step of a model's turn has: the same call repeated within one message
        # is a doom loop, and from the third time on it waits for the user's answer to a permission request.
        messages = itertools.count(1)

        def call(tool: str, args: dict[str, Any]) -> Awaitable[object]:
            return client.execute_tool(session.id, tool, args, message_id=f"bench-{next(messages)}")

        first = await client.execute_tool(session.id, "t07", {"n": 21})
        if first.output != expected:
            raise RuntimeError(f"unexpected custom tool output {first.output!r} ({first.error})")
        await timed(10, lambda: call("t07", {"n": 21}))
        rows["call"] = Row("custom tool call", await timed(call_n, lambda: call("t07", {"n": 21})))
        read_args = {"filePath": "/workspace/bench/once.ts", "limit": 2}
        await timed(5, lambda: call("read", read_args))
        rows["read"] = Row("diag: built-in read through the same chain",
                           await timed(call_n, lambda: call("read", read_args)))

        # `invalid` runs in the control plane; called by name it needs no registry refresh from the agent.
        invalid_args = {"tool": "t07", "error": "bench"}
        probe = await client.execute_tool(session.id, "invalid", invalid_args)
        if probe.output != "The arguments provided to the tool are invalid: bench":
            raise RuntimeError(f"unexpected invalid-tool output {probe.output!r} ({probe.error})")
        await timed(5, lambda: call("invalid", invalid_args))
        rows["cp_only"] = Row("diag: control-plane-only call (invalid tool)",
                              await timed(call_n, lambda: call("invalid", invalid_args)))

        once = [BUN, "--no-install", "run", "/workspace/bench/once.ts", "/workspace/.opencode/tool/t07.ts", '{"n":21}']
        if await run_ok(client, session.id, once) != expected:
            raise RuntimeError("the fresh-runtime baseline printed something else")
        rows["fresh"] = Row("baseline: fresh bun run per call (agent exec)",
                            await timed(fresh_n, lambda: run_ok(client, session.id, once)))
        await timed(5, lambda: run_ok(client, session.id, ["true"]))
        rows["exec_true"] = Row("diag: agent exec true", await timed(fresh_n * 2,
                                                                     lambda: run_ok(client, session.id, ["true"])))

        agent = (await plane.plane.sessions._provider.get(session.sandbox_id)).agent
        for tool, args, label in (("t07", {"n": 21, "label": "t07"}, "custom"), ("read", read_args, "built-in read")):
            def direct(tool: str = tool, args: dict[str, object] = args) -> Awaitable[None]:
                return run_on_agent(agent, tool, args, session.id)

            await timed(5, direct)
            rows[f"agent_{tool}"] = Row(f"diag: agent RunTool {label} (no public API)", await timed(call_n, direct))
        rows["agent_list"] = Row("diag: agent ListCustomTools (repeated)",
                                 await timed(list_n, lambda: agent.list_custom_tools("{}", {})))

        rtt = json.loads(await run_ok(client, session.id, ["python3", "/workspace/bench/host_rtt.py", "t07",
                                                           str(call_n), BUN]))
        rows["host_rtt"] = Row("diag: Bun host alone, call over its pipes", rtt["call_ms"][5:])
        rows["host_start"] = Row("stage: Bun host alone, start to first pong", [rtt["start_ms"]])
        rows["host_load"] = Row(f"stage: Bun host alone, load of {TOOLS} files", [rtt["load_ms"]])

        stages_ts = [BUN, "--no-install", "run", "/workspace/bench/stages.ts"]
        stages = [json.loads(await run_ok(client, session.id, stages_ts)) for _ in range(max(3, cold_n))]
        for key, label in (("runtime", "stage: bun runtime start"),
                           ("packages", "stage: import @opencode-ai/plugin + zod"),
                           ("files", f"stage: import {TOOLS} files + toJSONSchema")):
            rows[key] = Row(label, [float(s[key]) for s in stages])
    finally:
        await client.delete_session(session.id)
    return rows, notes


def report(rows: dict[str, Row], notes: list[str]) -> list[str]:
    header = f"  {'measurement':<50} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'min ms':>9} {'max ms':>9}"
    title = f"custom tools ({TOOLS} TypeScript tools, Docker sandbox, public gRPC API)"
    lines = [title, header, "  " + "-" * (len(header) - 2)]
    lines += [row.line() for row in rows.values()]
    cold, call, fresh, exec_true = rows["cold"], rows["call"], rows["fresh"], rows["exec_true"]
    in_bun = rows["runtime"].p50 + rows["packages"].p50 + rows["files"].p50
    lines += [
        "  ratios and breakdown:",
        f"    custom tool call vs fresh bun run per call: {fresh.p50 / call.p50:.1f}x faster",
        f"    fresh bun run minus agent exec overhead: {fresh.p50 - exec_true.p50:.2f} ms of Bun per call",
        f"    cold ListTools: {rows['cold_agent'].p50:.1f} ms in the agent (scan, Bun host start and loads), of which "
        f"{in_bun:.1f} ms is what one fresh Bun needs (start + packages + files); "
        f"{cold.p50 - rows['cold_agent'].p50:.1f} ms in the control plane and public API (built-ins' first init, "
        "sessions measured apart)",
        f"    repeated ListTools: {rows['repeated'].p50:.2f} ms, of which the agent's re-scan "
        f"{rows['agent_list'].p50:.2f} ms",
        f"    custom call: {rows['agent_t07'].p50:.2f} ms in the agent and Bun host, "
        f"{call.p50 - rows['agent_t07'].p50:.2f} ms public API + control plane; "
        f"vs built-in read {call.p50 - rows['read'].p50:+.2f} ms (agent only: "
        f"{rows['agent_t07'].p50 - rows['agent_read'].p50:+.2f} ms); the Bun host's own round trip "
        f"{rows['host_rtt'].p50:.2f} ms; a call that never leaves the control plane {rows['cp_only'].p50:.2f} ms",
        *(f"    note: {note}" for note in notes),
        "  targets:",
        f"    {'PASS' if cold.p50 <= COLD_TARGET_MS else 'FAIL'}  cold {TOOLS}-tool ListTools p50 {cold.p50:.1f} ms "
        f"<= {COLD_TARGET_MS:g} ms",
        f"    {'PASS' if rows['host_start'].p50 <= BUN_START_TARGET_MS else 'FAIL'}  Bun host's first start "
        f"{rows['host_start'].p50:.1f} ms <= {BUN_START_TARGET_MS:g} ms",
        f"    {'PASS' if call.p50 <= CALL_TARGET_MS else 'FAIL'}  custom tool call p50 {call.p50:.2f} ms "
        f"<= {CALL_TARGET_MS:g} ms ({fresh.p50 / call.p50:.1f}x faster than a fresh bun run)",
    ]
    return lines


async def section(quick: bool) -> list[str]:
    """The report lines of this benchmark (a Docker-backed control plane of its own, removed afterwards)."""
    async with running_plane("docker", pool={"size": 1, "refill_concurrency": 1}) as plane:
        await wait_pool_full(plane)
        rows, notes = await measure(plane, quick)
    return report(rows, notes)


def main() -> int:
    return run_alone(section, __doc__)


if __name__ == "__main__":
    sys.exit(main())
