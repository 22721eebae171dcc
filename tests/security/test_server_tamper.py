"""Nothing that serves later calls can be reached by a tool process (issue 21, item 5).

The Bun tool host, the Python tool host, the language server and a (Bun-run) local MCP server serve
every later call of the session:
a `bash` call that could ptrace one, read or write its memory, stop or kill it, or replace a file it
runs from, could change what later custom-tool calls and plugin hooks return. Each attack runs through
every vector of the suite (the bash tool; a process a TypeScript custom tool spawns; one a Python custom
tool spawns), and once more from custom-tool code itself, inside the Bun host, against the other servers.
Afterwards every server is the same process with the same module state, and still answers. All of it on runc
and on gVisor, whose execve does not keep a split identity (sandbox_agent/server_identity.py).
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.client import AsyncClient
from controlplane.v1 import tool_pb2
from tests.archives import tar_of
from tests.planes import Plane, running_plane
from tests.security.conftest import PROBE_FILES, Vector, python_probe
from tests.tool_uids import tool_uid

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

STATE_TS = """import { tool } from "@opencode-ai/plugin"
import { readFileSync } from "node:fs"

let counter = 0

export const count = tool({
  description: "Counts its calls in module state",
  args: {},
  async execute() {
    counter += 1
    return `count ${counter} pid ${process.pid}`
  },
})

export const stubborn = tool({
  description: "Ignores abort",
  args: {},
  async execute(_args, ctx) {
    ctx.metadata({ title: "running" })
    await Bun.sleep(3000)
    return "stubborn finished"
  },
})

function outcome(body: () => unknown): string {
  try {
    body()
    return "SUCCEEDED"
  } catch (error) {
    return String((error as { code?: string }).code ?? error)
  }
}

// Custom-tool code runs inside the Bun host (that is its job); what it must not reach is every other server.
export const attack = tool({
  description: "Attacks other servers from inside the Bun host",
  args: { pids: tool.schema.array(tool.schema.number()) },
  async execute(args) {
    const lines: string[] = []
    for (const pid of args.pids) {
      lines.push(`${pid} read mem: ${outcome(() => readFileSync(`/proc/${pid}/mem`))}`)
      for (const signal of ["SIGSTOP", "SIGTERM", "SIGKILL"]) {
        lines.push(`${pid} ${signal}: ${outcome(() => process.kill(pid, signal))}`)
      }
    }
    return lines.join("\\n")
  },
})
"""

PYSTATE_PY = '''import os

from opencode_tool import tool

counter = 0


async def _count(args, ctx):
    global counter
    counter += 1
    return f"count {counter} pid {os.getpid()}"


count = tool(description="Counts its calls in module state", args={"type": "object", "properties": {}},
             execute=_count)
'''

SHAPES_PY = '"""Shapes."""\n\n\nclass Square:\n    """A square."""\n\n    side = 2\n'

MCP_SERVER_TS = (Path(__file__).parent.parent / "docker" / "mcp_stdio_server.ts").read_text()
CONFIG = {"mcp": {"ts": {"type": "local", "command": ["bun", "run", "--no-install", "mcp_stdio_server.ts"]}}}

FILES = {**PROBE_FILES, ".opencode/tool/state.ts": STATE_TS, ".opencode/tool/pystate.py": PYSTATE_PY,
         "shapes.py": SHAPES_PY, "mcp_stdio_server.ts": MCP_SERVER_TS}

ATTACK = r"""
import ctypes, errno, os, signal, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206


def report(name, target, attempt):
    try:
        attempt()
        print(f"{name} {target}: SUCCEEDED")
    except OSError as exc:
        print(f"{name} {target}: {errno.errorcode.get(exc.errno, exc.errno)}")


def ptrace(request, pid):
    def run():
        if libc.ptrace(request, pid, None, None) == -1:
            raise OSError(ctypes.get_errno(), "ptrace")
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    return run


def mem_write(pid):
    def run():
        fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        os.close(fd)
    return run


def mem_read(pid):
    def run():
        with open(f"/proc/{pid}/mem", "rb") as f:
            f.read(1)
    return run


print("attacker uids:", " ".join(map(str, os.getresuid())))
for name, pid in zip(sys.argv[1::2], map(int, sys.argv[2::2])):
    report("attach", name, ptrace(PTRACE_ATTACH, pid))
    report("seize", name, ptrace(PTRACE_SEIZE, pid))
    report("mem-read", name, mem_read(pid))
    report("mem-write", name, mem_write(pid))
    for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
        report(signal.Signals(sig).name, name, lambda sig=sig: os.kill(pid, sig))
"""

RUN_FROM = [
    "/opt/agent/toolhost/host.ts", "/opt/agent/toolhost/harden.ts", "/opt/agent/toolhost/calls.ts",
    "/opt/agent/toolhost/bunfig.toml", "/opt/agent/pyhost/host.py", "/opt/agent/pyhost/pyhost_harden.py",
    "/opt/agent/pyhost/opencode_tool.py", "/usr/local/bin/bun", "/node_modules/zod/package.json",
    "/node_modules/@opencode-ai/plugin/package.json",
]
"""Files the servers run from (the language server's package is found at run time)."""

REPLACE = r"""
jedi=$(python3 -c 'import jedi_language_server, os; print(os.path.dirname(jedi_language_server.__file__))')
for f in "$@" "$jedi/cli.py" "$jedi"; do
  if [ ! -e "$f" ]; then echo "missing $f"; continue; fi
  ( : >> "$f" ) 2>/dev/null && echo "append $f: SUCCEEDED" || echo "append $f: refused"
  mv "$f" "$f.moved" 2>/dev/null && echo "rename $f: SUCCEEDED" || echo "rename $f: refused"
  ln -s /tmp/x "$f.new" 2>/dev/null && echo "link beside $f: SUCCEEDED" || echo "link beside $f: refused"
done
"""


@pytest.fixture(scope="module")
async def gvisor_lsp_plane(lsp_flag: None) -> AsyncIterator[Plane]:
    """An `lsp` plane whose sandboxes run on gVisor, where a server takes its identity after the exec."""
    async with running_plane("docker", provider_options={"runtime": "runsc"},
                             pool={"size": 1, "refill_concurrency": 1}) as plane:
        yield plane


@pytest.fixture(scope="module")
def plane(runtime: str, request: pytest.FixtureRequest) -> Plane:
    """runc (the shared `lsp` plane), then gVisor: every server keeps the same identity on both."""
    found: Plane = request.getfixturevalue("lsp_plane" if runtime == "runc" else "gvisor_lsp_plane")
    return found


@pytest.fixture(scope="module")
async def session_id(plane: Plane) -> AsyncIterator[str]:
    session = await plane.client.create_session(workspace_archive=tar_of(FILES), config_json=json.dumps(CONFIG))
    yield session.id
    await plane.client.delete_session(session.id)


async def _tool_uid(plane: Plane, session_id: str) -> int:
    """The session's own tool uid (its sandbox's block, controlplane/sandbox/tool_ids.py)."""
    return tool_uid(plane.instance, (await plane.client.get_session(session_id)).sandbox_id)


async def _count(client: AsyncClient, session_id: str, tool: str) -> tuple[int, int]:
    outcome = await client.execute_tool(session_id, tool, {})
    assert outcome.error is None, outcome.error
    _, number, _, pid = outcome.output.split()
    return int(number), int(pid)


async def _hover(client: AsyncClient, session_id: str) -> str:
    args = {"operation": "hover", "filePath": "shapes.py", "line": 4, "character": 8}
    outcome = await client.execute_tool(session_id, "lsp", args)
    assert outcome.error is None, outcome.error
    return outcome.output


async def _servers_running(client: AsyncClient, session_id: str) -> dict[str, int]:
    """The servers' pids (each started if it was not running), checking that each answers."""
    _, bun = await _count(client, session_id, "state_count")
    _, python = await _count(client, session_id, "pystate_count")
    hover = await _hover(client, session_id)
    assert "Square" in hover, hover
    echo = await client.execute_tool(session_id, "ts_echo", {"text": "still serving"})
    assert (echo.error, echo.output) == (None, "still serving")
    return {"bun": bun, "python": python, "lsp": await _pid_of(client, session_id, "jedi_language_server.cli"),
            "mcp": await _pid_of(client, session_id, "mcp_stdio_server.ts")}


async def _pid_of(client: AsyncClient, session_id: str, pattern: str) -> int:
    found = await client.run(session_id, ["pgrep", "-f", pattern])
    pids = [int(pid) for pid in found.stdout.split()]
    assert len(pids) == 1, found
    return pids[0]


def _assert_all_refused(output: str, servers: dict[str, int], uid: int) -> None:
    lines = output.splitlines()
    assert lines[0] == f"attacker uids: {uid} {uid} {uid}", output  # a plain tool process, whatever spawned it
    attempts = lines[1:]
    assert len(attempts) == 7 * len(servers), output
    assert all(line.endswith((": EPERM", ": EACCES")) for line in attempts), output


async def test_no_tool_process_can_ptrace_read_write_or_signal_a_server(
    plane: Plane, session_id: str, vector: Vector,
) -> None:
    client = plane.client
    servers = await _servers_running(client, session_id)
    args = " ".join(f"{name} {pid}" for name, pid in servers.items())
    output = await vector.run(client, session_id, python_probe(ATTACK, args))
    _assert_all_refused(output, servers, await _tool_uid(plane, session_id))
    await asyncio.sleep(0.3)  # a signal that got through would have acted by now
    assert await _servers_running(client, session_id) == servers


async def test_custom_tool_code_cannot_reach_the_other_servers(plane: Plane, session_id: str) -> None:
    client = plane.client
    servers = await _servers_running(client, session_id)
    others = [servers["python"], servers["lsp"], servers["mcp"]]
    outcome = await client.execute_tool(session_id, "state_attack", {"pids": others})
    assert outcome.error is None, outcome.error
    lines = outcome.output.splitlines()
    assert len(lines) == 4 * len(others), outcome.output
    assert all(line.endswith((": EPERM", ": EACCES")) for line in lines), outcome.output
    await asyncio.sleep(0.3)
    assert await _servers_running(client, session_id) == servers


async def test_no_tool_process_can_replace_what_a_server_runs(
    plane: Plane, session_id: str, vector: Vector,
) -> None:
    client = plane.client
    output = await vector.run(client, session_id, f"set -- {' '.join(RUN_FROM)}\n{REPLACE}")
    lines = output.splitlines()
    assert not [line for line in lines if "SUCCEEDED" in line or line.startswith("missing")], output
    assert len(lines) == 3 * (len(RUN_FROM) + 2), output


async def test_a_project_bunfig_never_runs_code_in_the_bun_host(plane: Plane, session_id: str) -> None:
    """Bun reads ./bunfig.toml at every start, and its `preload` runs before the host's own code."""
    client = plane.client
    marker = "/workspace/preloaded.txt"
    preload = f'require("node:fs").writeFileSync({json.dumps(marker)}, String(process.pid))'
    script = (f"printf '%s\\n' {shlex.quote(preload)} > /workspace/preload.js && "
              "printf 'preload = [\"/workspace/preload.js\"]\\n' > /workspace/bunfig.toml && echo written")
    assert (await client.run(session_id, ["sh", "-c", script])).stdout.strip() == b"written"
    _, pid = await _count(client, session_id, "state_count")
    # The model can restart an idle host at will: abort a call that ignores abort.
    stream, outbox = client.tool_call(session_id, "state_stubborn", {}, call_id="bunfig-restart")
    async for event in stream:
        if event.WhichOneof("event") == "metadata":
            outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="stop")))
        if event.WhichOneof("event") in ("result", "error"):
            break
    outbox.put_nowait(None)
    number, new_pid = await _count(client, session_id, "state_count")
    assert (number, new_pid != pid) == (1, True)  # a fresh host started, with the bunfig in its directory
    listing = await client.run(session_id, ["ls", "/workspace"])
    assert "preloaded.txt" not in listing.stdout.decode()
