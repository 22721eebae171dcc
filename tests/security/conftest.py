"""Attack vectors for the security suite: each runs a shell script inside a session the way untrusted code would.

A vector takes (client, session id, shell script) and returns what the script printed (stdout and stderr
merged, in order). Three vectors: the bash tool through ExecuteTool; a TypeScript custom tool run by Bun
(`.opencode/tool/probe.ts`, spawning the script with `Bun.spawn`); a Python custom tool run by the Python
tool host (`.opencode/tool/pyprobe.py`). Every escape test runs through each of them. Sessions must be
made with `new_session` so that the probe tools are in their workspace.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from controlplane.client import AsyncClient, Session, allow_once
from tests import runtimes
from tests.archives import tar_of
from tests.planes import Plane, running_plane

runtime = runtimes.runtime
"""runc, then gVisor where it runs (tests/runtimes.py)."""

Runner = Callable[[AsyncClient, str, str], Awaitable[str]]

PROBE_TS = r"""import { tool } from "@opencode-ai/plugin"
import * as fs from "node:fs"

// The script's stdout and stderr share one file, as they share one pipe under the bash tool; the call
// ends when the shell exits (not when background children close their copies), like the bash tool.
async function runScript(script: string): Promise<string> {
  const dir = fs.mkdtempSync("/tmp/.probe-")
  const path = `${dir}/out`
  const fd = fs.openSync(path, "w")
  try {
    const child = Bun.spawn(["/bin/bash", "-c", script], { stdin: "ignore", stdout: fd, stderr: fd })
    await child.exited
    return fs.readFileSync(path, "utf8")
  } finally {
    fs.closeSync(fd)
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

export default tool({
  description: "Security suite probe: runs a shell script from a custom tool",
  args: { script: tool.schema.string() },
  async execute(args) {
    return await runScript(args.script)
  },
})

function outcome(error: unknown): string {
  const e = error as { code?: unknown; name?: unknown; message?: unknown }
  if (typeof e?.code === "string" && e.code) return e.code
  return `${String(e?.name)}: ${String(e?.message)}`
}

async function attempt(name: string, body: () => unknown): Promise<string> {
  try {
    const value = await body()
    return `${name}: SUCCEEDED ${String(value).slice(0, 80)}`
  } catch (error) {
    return `${name}: ${outcome(error)}`
  }
}

function agentPid(): number {
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    try {
      if (fs.readFileSync(`/proc/${entry}/cmdline`, "utf8") === "python3\0-m\0sandbox_agent\0") return Number(entry)
    } catch {
      // the process ended while we looked
    }
  }
  throw new Error("no agent process found")
}

function connectUnix(path: string): Promise<string> {
  return Bun.connect({ unix: path, socket: { data() {} } }).then((socket) => {
    socket.end()
    return "connected"
  })
}

export const js = tool({
  description: "Security suite probe: escape attempts written in JavaScript",
  args: { host: tool.schema.string(), port: tool.schema.number(), marker: tool.schema.string() },
  async execute(args) {
    const agent = agentPid()
    const lines = [
      await attempt("fetch loopback", () => fetch(`http://127.0.0.1:${args.port}/`).then((r) => r.status)),
      await attempt("fetch docker0", () =>
        fetch(`http://${args.host}:${args.port}/`, { signal: AbortSignal.timeout(3000) }).then((r) => r.status)),
      await attempt("fetch docker api", () =>
        fetch("http://localhost/version", { unix: "/var/run/docker.sock" } as RequestInit).then((r) => r.status)),
      await attempt("dns lookup", () => Bun.dns.lookup("escape-probe.invalid")),
      await attempt("connect docker.sock", () => connectUnix("/var/run/docker.sock")),
      await attempt("connect agent.sock", () => connectUnix("/run/agent/agent.sock")),
      await attempt("read host marker", () => fs.readFileSync(args.marker, "utf8")),
      await attempt("read /proc/1/environ", () => fs.readFileSync("/proc/1/environ", "utf8")),
      await attempt("read agent environ", () => fs.readFileSync(`/proc/${agent}/environ`, "utf8")),
      await attempt("read agent mem", () => fs.readFileSync(`/proc/${agent}/mem`)),
      await attempt("read /etc/shadow", () => fs.readFileSync("/etc/shadow", "utf8")),
      await attempt("kill init", () => process.kill(1, "SIGKILL")),
      await attempt("kill agent", () => process.kill(agent, "SIGKILL")),
      await attempt("stop agent", () => process.kill(agent, "SIGSTOP")),
      await attempt("setuid 0", () => process.setuid(0)),
      await attempt("write /etc", () => fs.writeFileSync("/etc/escape", "x")),
      await attempt("append agent source", () =>
        fs.appendFileSync("/opt/agent/sandbox_agent/server.py", "x")),
      await attempt("write /usr/local/bin", () => fs.writeFileSync("/usr/local/bin/escape", "x")),
      await attempt("list agent socket dir", () => fs.readdirSync("/run/agent")),
      `agent alive: ${agentPid() === agent}`,
    ]
    return lines.join("\n") + "\n"
  },
})
"""

PYPROBE_PY = '''import asyncio
import os
import tempfile

from opencode_tool import tool


async def run_script(args, ctx):
    # One file for stdout and stderr, and the end of the shell (not of its pipes) ends the call: as the bash tool.
    fd, path = tempfile.mkstemp(prefix=".pyprobe-", dir="/tmp")
    try:
        child = await asyncio.create_subprocess_exec(
            "/bin/bash", "-c", args["script"], stdin=asyncio.subprocess.DEVNULL, stdout=fd, stderr=fd
        )
        await child.wait()
        with open(path, encoding="utf-8", errors="replace") as out:
            return out.read()
    finally:
        os.close(fd)
        os.unlink(path)


default = tool(
    description="Security suite probe: runs a shell script from a Python custom tool",
    args={"type": "object", "properties": {"script": {"type": "string"}}, "required": ["script"]},
    execute=run_script,
)
'''

PROBE_FILES = {".opencode/tool/probe.ts": PROBE_TS, ".opencode/tool/pyprobe.py": PYPROBE_PY}


@dataclass(frozen=True)
class Vector:
    name: str
    run: Runner


async def through_bash_tool(client: AsyncClient, session_id: str, script: str) -> str:
    # Every ask is approved: what must stop an escape is the sandbox, not a permission prompt.
    outcome = await client.execute_tool(
        session_id, "bash", {"command": script, "description": "Escape attempt", "timeout": 60_000},
        on_permission=allow_once,
    )
    return outcome.output


def through_custom_tool(tool: str) -> Runner:
    async def run(client: AsyncClient, session_id: str, script: str) -> str:
        outcome = await client.execute_tool(session_id, tool, {"script": script})
        assert outcome.error is None, f"the {tool} custom tool failed: {outcome.error}"
        return outcome.output

    return run


BASH = Vector("bash", through_bash_tool)
CUSTOM_TS = Vector("custom-ts", through_custom_tool("probe"))
CUSTOM_PY = Vector("custom-py", through_custom_tool("pyprobe"))
VECTORS = [BASH, CUSTOM_TS, CUSTOM_PY]
if os.environ.get("OCSB_ATTACK_VECTORS"):
    # e.g. OCSB_ATTACK_VECTORS=bash for a quick look at one vector only.
    VECTORS = [v for v in VECTORS if v.name in os.environ["OCSB_ATTACK_VECTORS"].split(",")]


@pytest.fixture(params=VECTORS, ids=[v.name for v in VECTORS])
def vector(request: pytest.FixtureRequest) -> Vector:
    chosen: Vector = request.param
    return chosen


async def new_session(client: AsyncClient, *, memory_mb: int = 0) -> Session:
    """A session whose workspace holds the probe tools (every vector can run in it)."""
    return await client.create_session(workspace_archive=tar_of(PROBE_FILES), memory_mb=memory_mb)


def python_probe(code: str, *args: str) -> str:
    """A shell snippet running `code` with the sandbox's python3 (syscalls the shell cannot make)."""
    return f"python3 - {' '.join(args)} <<'PY'\n{code.strip()}\nPY\n"


@dataclass(frozen=True)
class Pair:
    """Two sessions of the same tenant: A attacks, B is the neighbour it must not reach."""

    a: str
    a_sandbox: str
    b: str
    b_sandbox: str


@pytest.fixture(scope="module")
async def runtime_plane(docker_plane: Plane, runtime: str) -> AsyncIterator[Plane]:
    """The shared Docker plane on runc; on gVisor a plane of the module's own with `provider.runtime = "runsc"`
    (every session and the warm pool on gVisor; a tenant's `runtime` takes the same path, test_kernel_state)."""
    if runtime == "runc":
        yield docker_plane
        return
    pool = {"size": 2, "refill_concurrency": 2}
    async with running_plane("docker", provider_options={"runtime": runtime}, pool=pool) as plane:
        yield plane


@pytest.fixture(scope="module")
async def pair(runtime_plane: Plane) -> AsyncIterator[Pair]:
    a = await new_session(runtime_plane.client)
    b = await new_session(runtime_plane.client)
    yield Pair(a.id, a.sandbox_id, b.id, b.sandbox_id)
    for session in (a, b):
        await runtime_plane.client.delete_session(session.id)
