"""The escape attempts that matter most, on gVisor (issue 22, part 4), through the bash vector.

The plane's one tenant has `runtime = "runsc"` in its `[[tenants]]` entry: every session and the warm pool
run on gVisor. test_escape.py compares exact refusals as runc's kernel words them; gVisor's kernel (Debian's
2022 build) words several differently (coreutils' `statx` of a missing or closed path is "Invalid argument"
there), so these attempts are made with Python and checked by what got through, not by the message. One
vector keeps the added time small; the kernel-state attacks run on both runtimes in test_kernel_state.py.
Skipped, with the reason, where runsc cannot run here (tests/runtimes.py).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.client import AsyncClient
from tests.planes import Plane, running_plane
from tests.runtimes import skip_unless_usable
from tests.security.conftest import new_session, python_probe, through_bash_tool
from tests.security.escape_probes import NETWORK_PROBE, Listener, listeners  # noqa: F401 - the fixture

pytestmark = pytest.mark.docker

AGENT = "$(pgrep -xf 'python3 -m sandbox_agent')"

REACH_PROBE = """
import os, socket, sys
def attempt(name, fn):
    try:
        fn(); print(name, "SUCCEEDED")
    except OSError as e:
        print(name, "refused")
agent = sys.argv[1]
attempt("read host marker", lambda: open(sys.argv[2]).read())
attempt("docker.sock", lambda: socket.socket(socket.AF_UNIX).connect("/var/run/docker.sock"))
attempt("agent.sock", lambda: socket.socket(socket.AF_UNIX).connect("/run/agent/agent.sock"))
attempt("list /run/agent", lambda: os.listdir("/run/agent"))
attempt("agent mem", lambda: open(f"/proc/{agent}/mem", "rb").read(1))
attempt("agent cwd", lambda: os.listdir(f"/proc/{agent}/cwd"))
attempt("agent root", lambda: os.listdir(f"/proc/{agent}/root"))
attempt("kill agent", lambda: os.kill(int(agent), 9))
attempt("stop agent", lambda: os.kill(int(agent), 19))
attempt("kill init", lambda: os.kill(1, 9))
for path in ("/etc/escape", "/usr/local/bin/escape", "/opt/agent/sandbox_agent/escape.py", "/escape", "/root/x"):
    attempt("write " + path, lambda: open(path, "w").write("x"))
attempt("setuid 0", lambda: os.setuid(0))
"""

SEARCH = """
import os, sys
found = []
for root, dirs, files in os.walk("/"):
    if root.startswith(("/proc", "/sys", "/dev")):
        dirs[:] = []
        continue
    for name in files:
        try:
            data = open(os.path.join(root, name), "rb").read(4096)
        except OSError:
            continue
        found += [n[::-1] for n in sys.argv[1:] if n[::-1].encode() in data]
print(sorted(set(found)))
"""

AGENT_PROC = """
import sys
agent = sys.argv[1]
for name in ("environ", "maps", "auxv", "fd"):
    try:
        open(f"/proc/{agent}/{name}", "rb").read(1) if name != "fd" else __import__("os").listdir(f"/proc/{agent}/fd")
        print(name, "READ")
    except OSError:
        print(name, "refused")
"""


@pytest.fixture(scope="module")
async def gvisor_plane() -> AsyncIterator[Plane]:
    skip_unless_usable("runsc")
    tenant = {"name": f"gvisor-{secrets.token_hex(3)}", "token": secrets.token_hex(16), "runtime": "runsc"}
    async with running_plane("docker", tenants=[tenant], pool={"size": 1, "refill_concurrency": 1}) as plane:
        yield plane


@pytest.fixture(scope="module")
async def sessions(gvisor_plane: Plane) -> AsyncIterator[tuple[str, str]]:
    client = gvisor_plane.client
    a, b = await client.create_session(), await client.create_session()
    yield a.id, b.id
    for session in (a, b):
        await client.delete_session(session.id)


async def bash(client: AsyncClient, session_id: str, script: str) -> str:
    return await through_bash_tool(client, session_id, script)


async def test_the_sandbox_runs_on_gvisor_as_its_own_uid(gvisor_plane: Plane, sessions: tuple[str, str]) -> None:
    out = await bash(gvisor_plane.client, sessions[0], "cat /proc/version; id -u; grep -E '^CapEff' /proc/self/status")
    kernel, uid, caps = out.splitlines()
    assert kernel.startswith("Linux version 4.4.0")  # gVisor's own kernel answers
    assert int(uid) >= 200_000
    assert caps == "CapEff:\t0000000000000000"


async def test_nothing_of_the_host_or_the_agent_is_reachable(
    gvisor_plane: Plane, sessions: tuple[str, str], tmp_path: Path,
) -> None:
    marker = Path(f"/tmp/ocsb-host-marker-{secrets.token_hex(4)}")
    await asyncio.to_thread(marker.write_text, "host secret\n")
    try:
        script = f"A={AGENT}; " + python_probe(REACH_PROBE, "$A", str(marker)) + f"echo agent={AGENT}"
        out = (await bash(gvisor_plane.client, sessions[0], script)).splitlines()
    finally:
        await asyncio.to_thread(marker.unlink)
    assert [line for line in out if "SUCCEEDED" in line] == []
    assert len([line for line in out if line.endswith(" refused")]) == 16, out
    assert out[-1].removeprefix("agent=").isdigit()  # the agent is still there


async def test_another_session_is_unreachable(gvisor_plane: Plane, sessions: tuple[str, str]) -> None:
    a, b = sessions
    secret = secrets.token_hex(8)
    assert await bash(gvisor_plane.client, b, f"echo {secret} > /workspace/neighbour.txt; echo ok") == "ok\n"
    own = secrets.token_hex(8)
    await bash(gvisor_plane.client, a, f"echo {own} > /workspace/own.txt")
    # The needles are given reversed: written plainly, this command's own cmdline would match.
    out = await bash(gvisor_plane.client, a, python_probe(SEARCH, own[::-1], secret[::-1]))
    assert out == f"{[own]}\n"  # its own marker is found (the search works), the neighbour's is not


async def test_network_reaches_nothing_outside(
    gvisor_plane: Plane, sessions: tuple[str, str], listeners: dict[str, Listener],  # noqa: F811
) -> None:
    bridge, loop = listeners["docker0"], listeners["loopback"]
    args = (bridge.host, str(bridge.tcp_port), str(bridge.udp_port), str(loop.tcp_port), str(loop.udp_port))
    out = (await bash(gvisor_plane.client, sessions[0], python_probe(NETWORK_PROBE, *args))).splitlines()
    assert [line for line in out if "CONNECTED" in line] == []
    assert out[0] == "interfaces: lo"
    assert out[-1] in ("resolve EAI_AGAIN", "resolve EAI_NONAME")
    await asyncio.sleep(0.2)
    assert bridge.hits == []
    assert loop.hits == []


@pytest.mark.xfail(strict=True, reason="gVisor 0.0~20221219 (Debian) lets any uid read another process's /proc "
                                       "environ, maps, auxv and fd list (runc refuses them): a known gap, "
                                       "docs/security.md")
async def test_the_agents_proc_entries_are_closed(gvisor_plane: Plane, sessions: tuple[str, str]) -> None:
    out = await bash(gvisor_plane.client, sessions[0], f"A={AGENT}; " + python_probe(AGENT_PROC, "$A"))
    assert out == "environ refused\nmaps refused\nauxv refused\nfd refused\n"


ENVIRON = """
import sys
for pid in sys.argv[1:]:
    raw = open(f"/proc/{pid}/environ", "rb").read()
    names = sorted(entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\\0") if b"=" in entry)
    print(pid, len(raw.replace(b"\\0", b"")), names)
"""

CONTAINER_ENV = ["AGENT_CODE_DIR", "AGENT_OUTPUT_BUDGET_BYTES", "AGENT_SOCKET", "AGENT_SYSCALL_DENY", "AGENT_TOOL_UID",
                 "AGENT_WORKSPACE", "GRPC_ENABLE_FORK_SUPPORT", "HOME", "HOSTNAME", "LANG", "PATH", "PYTHONOPTIMIZE",
                 "PYTHONPATH"]
"""Everything the container starts with (the image's and the Docker provider's): paths, the tool uid, the
filter's list. No secret may ever be added: on gVisor every process in the sandbox can read PID 1's copy."""


async def test_what_gvisor_shows_of_the_agents_environment_holds_nothing(
    gvisor_plane: Plane, sessions: tuple[str, str],
) -> None:
    """Gap 7: where gVisor lets a tool process read another process's environ, the agent's is blank (it scrubs
    its start-up strings, sandbox_agent/environ_scrub.py) and init's holds only the known, non-secret names."""
    out = await bash(gvisor_plane.client, sessions[0], f"A={AGENT}; " + python_probe(ENVIRON, "$A", "1"))
    agent_line, init_line = out.splitlines()
    assert agent_line.split(" ", 1)[1] == "0 []"  # readable here (the xfail below), but blank
    pid, _size, names = init_line.split(" ", 2)
    assert pid == "1"
    assert names == str(CONTAINER_ENV)


async def test_custom_tools_load_on_gvisor(gvisor_plane: Plane) -> None:
    """Gap 8, closed: gVisor's execve drops the split identity a tool host starts with, so the host is started
    as root with CAP_SETUID alone and takes its uids itself (sandbox_agent/server_identity.py)."""
    session = await new_session(gvisor_plane.client)
    try:
        outcome = await gvisor_plane.client.execute_tool(session.id, "probe", {"script": "echo from bun"})
        assert outcome.output == "from bun\n"
        outcome = await gvisor_plane.client.execute_tool(session.id, "pyprobe", {"script": "echo from python"})
        assert outcome.output == "from python\n"
    finally:
        await gvisor_plane.client.delete_session(session.id)
