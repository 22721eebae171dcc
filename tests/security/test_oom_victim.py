"""The OOM killer's choice stays a tool process: tool processes cannot lower their `oom_score_adj`.

The attack this guards: with bash allowed, thirty small tool processes each wrote 0 back to their own
`oom_score_adj` (the kernel allowed it: the value had been written without CAP_SYS_RESOURCE, so its floor
stayed 0), held 14 MiB each, and `/tmp` and `/dev/shm` were filled; at the container's memory limit the
largest process at 0 was the agent, the container ended and the session was FAILED. Tool processes and the
tool hosts now run in a Landlock domain that refuses every write under /proc (sandbox_agent/proc_guard.py).

runc only: gVisor has no Landlock (ENOSYS) and no OOM killer per process (its limit is the sandbox's as a
whole; docs/security.md, gaps), so there the score neither can be guarded nor decides anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import pytest

from controlplane.client import Session, allow_once
from controlplane.v1 import session_pb2
from tests.archives import tar_of
from tests.planes import Plane
from tests.security.conftest import BASH, PROBE_FILES, Vector, new_session, python_probe
from tests.security.test_exhaustion import agent_memory_kb, as_root

pytestmark = pytest.mark.docker

AGENT_PID = "$(pgrep -xf 'python3 -m sandbox_agent')"
LOWER = python_probe("""
import errno
path = "/proc/self/oom_score_adj"
before = open(path).read().strip()
results = []
for value in ("0", "-1", str(int(before) - 1)):
    try:
        with open(path, "w") as f:
            f.write(value)
        results.append(value + ":written")
    except OSError as e:
        results.append(value + ":" + errno.errorcode[e.errno])
print(before, *results, open(path).read().strip())
""")

HOG_SCRIPT = r"""
head -c 100M /dev/zero > /tmp/fill 2>/dev/null; head -c 60M /dev/zero > /dev/shm/fill 2>/dev/null
for i in $(seq 1 30); do
  python3 -c 'import time
try:
    open("/proc/self/oom_score_adj", "w").write("0")
except OSError:
    pass
b = bytearray(14 * 1024 * 1024); b[::4096] = b"x" * len(b[::4096]); time.sleep(15)' &
done
sleep 6; wait; echo hogs done
"""
"""The red team's attack, as it ran (its hogs sleep 15 s instead of 60 s so that the call ends sooner)."""


@pytest.fixture(scope="module")
async def probed(docker_plane: Plane) -> AsyncIterator[Session]:
    session = await new_session(docker_plane.client)
    yield session
    await docker_plane.client.delete_session(session.id)


async def test_a_tool_process_cannot_lower_its_oom_score(docker_plane: Plane, probed: Session, vector: Vector) -> None:
    out = await vector.run(docker_plane.client, probed.id, LOWER)
    # The bash tool's processes come from the spawner helper (1000); a custom tool's from its tool host (500).
    start = "1000" if vector is BASH else "500"
    below = str(int(start) - 1)
    assert out == f"{start} 0:EACCES -1:EACCES {below}:EACCES {start}\n"


async def test_tool_processes_hold_no_capability(docker_plane: Plane, probed: Session, vector: Vector) -> None:
    out = await vector.run(docker_plane.client, probed.id, (
        "grep -E '^(CapInh|CapPrm|CapEff|CapAmb|CapBnd|NoNewPrivs):' /proc/self/status;"
        f" grep -E '^(CapPrm|CapEff):' /proc/{AGENT_PID}/status"
    ))
    expected = (
        "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
        # The container's bounding set (SETGID, SETUID, KILL): a limit, not a capability held; no-new-privileges
        # and a non-root uid with empty sets leave nothing an exec could take from it.
        "CapBnd:\t00000000000000e0\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n"
        # The agent: the same three, and no more (no CAP_SYS_RESOURCE: the guard needs no privilege).
        "CapPrm:\t00000000000000e0\nCapEff:\t00000000000000e0\n"
    )
    assert out == expected


PYHOST_LOWER = '''import ctypes
import errno

from opencode_tool import tool


async def lower(args, ctx):
    # The tool host process itself: a non-dumpable process's /proc files are root's, so first become dumpable
    # again (any process may), which makes /proc/self/oom_score_adj this process's own to write.
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
    path = "/proc/self/oom_score_adj"
    before = open(path).read().strip()
    try:
        with open(path, "w") as f:
            f.write("0")
        outcome = "written"
    except OSError as e:
        outcome = errno.errorcode[e.errno]
    return f"{before} {outcome} {open(path).read().strip()}"


default = tool(description="Tries to lower the Python tool host's own OOM score",
               args={"type": "object", "properties": {}}, execute=lower)
'''


async def test_a_tool_host_cannot_lower_its_own_oom_score(docker_plane: Plane) -> None:
    client = docker_plane.client
    session = await client.create_session(workspace_archive=tar_of({".opencode/tool/lower.py": PYHOST_LOWER}))
    try:
        outcome = await client.execute_tool(session.id, "lower", {})
        assert outcome.error is None, outcome.error
        assert outcome.output == "500 EACCES 500"
    finally:
        await client.delete_session(session.id)


@pytest.fixture
async def hog_target(docker_plane: Plane) -> AsyncIterator[Session]:
    session = await docker_plane.client.create_session(
        memory_mb=512, workspace_archive=tar_of({"keep.txt": "user file\n", **PROBE_FILES}))
    yield session
    await docker_plane.client.delete_session(session.id)


async def test_small_tool_processes_that_lower_their_score_do_not_make_the_agent_the_victim(
    docker_plane: Plane, hog_target: Session,
) -> None:
    client, session = docker_plane.client, hog_target
    agent_before = as_root(docker_plane, session.sandbox_id, "pgrep -xf 'python3 -m sandbox_agent'").strip()
    attack = await client.execute_tool(
        session.id, "bash", {"command": HOG_SCRIPT, "description": "OOM pressure", "timeout": 60_000},
        on_permission=allow_once)
    assert attack.error is None, attack.error
    # The kernel killed hogs (the agent reports the cgroup's OOM kills), and the call itself came back.
    assert attack.metadata.get("out_of_memory") is True, json.dumps(attack.metadata)
    assert re.search(r"Out of memory: the kernel killed a process of this session at its memory limit \(512 MiB\)",
                     attack.output), attack.output
    assert (await client.get_session(session.id)).state == session_pb2.Session.READY
    after = await client.execute_tool(session.id, "bash", {"command": "echo alive; cat keep.txt",
                                                           "description": "after"}, on_permission=allow_once)
    assert after.error is None, after.error
    assert after.output.startswith("alive\nuser file\n"), after.output
    assert await client.read_file(session.id, "keep.txt") == b"user file\n"
    # The same agent process, not a restarted one.
    assert as_root(docker_plane, session.sandbox_id, "pgrep -xf 'python3 -m sandbox_agent'").strip() == agent_before
    assert agent_memory_kb(docker_plane, session.sandbox_id)["oom_score_adj"] == 0


async def test_full_tmpfs_and_a_hog_leave_the_agent_alive(docker_plane: Plane) -> None:
    # tmpfs pages count against the limit and belong to no process: with /tmp and /dev/shm full (their caps are a
    # quarter and an eighth of the limit) the killer can only free memory by killing processes; it must take the hog.
    client = docker_plane.client
    session = await client.create_session(memory_mb=256, workspace_archive=tar_of({"keep.txt": "user file\n"}))
    try:
        agent_before = as_root(docker_plane, session.sandbox_id, "pgrep -xf 'python3 -m sandbox_agent'").strip()
        attack = await client.execute_tool(session.id, "bash", {
            "command": "head -c 1G /dev/zero > /tmp/fill; head -c 1G /dev/zero > /dev/shm/fill;"
                       " python3 -c 'b = []\nwhile True: b.append(bytearray(8 << 20))'; echo hog rc=$?",
            "description": "OOM pressure", "timeout": 60_000}, on_permission=allow_once)
        assert attack.error is None, attack.error
        assert "hog rc=137" in attack.output, attack.output
        assert attack.metadata.get("out_of_memory") is True, json.dumps(attack.metadata)
        assert (await client.get_session(session.id)).state == session_pb2.Session.READY
        assert await client.read_file(session.id, "keep.txt") == b"user file\n"
        assert as_root(docker_plane, session.sandbox_id, "pgrep -xf 'python3 -m sandbox_agent'").strip() == agent_before
    finally:
        await client.delete_session(session.id)
