"""A session's process limit on gVisor: held inside the guest, and reaching it does not lose the sandbox.

gVisor's ptrace platform backs guest processes with host stub tasks that count against the container's host
pids cgroup, and its Sentry panics when that cgroup refuses one (controlplane/sandbox/gvisor_limits.py). With
the session's `pids` as the host limit, a sandbox was lost long before it ran `pids` processes (the escape
suite lost one at its setuid probe). Skipped, with the reason, where runsc cannot run here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import docker
import pytest

from controlplane.client import allow_once
from controlplane.sandbox import gvisor_limits
from controlplane.v1 import session_pb2
from tests.planes import Plane, running_plane
from tests.runtimes import skip_unless_usable

pytestmark = pytest.mark.docker

PIDS = 64

FORKS = """
import os, time
kids, refused = [], 0
for _ in range(100):
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
print(len(kids), refused)
for kid in kids:
    os.waitpid(kid, 0)
"""


@pytest.fixture(scope="module")
async def gvisor_plane() -> AsyncIterator[Plane]:
    skip_unless_usable("runsc")
    async with running_plane("docker", provider_options={"runtime": "runsc"}, pool={"size": 0}) as plane:
        yield plane


async def bash(plane: Plane, session_id: str, command: str) -> str:
    outcome = await plane.client.execute_tool(
        session_id, "bash", {"command": command, "description": "Process limit"}, on_permission=allow_once,
    )
    assert outcome.error is None, outcome.error
    return outcome.output


async def test_forking_to_the_limit_is_refused_in_the_guest_and_the_sandbox_stays(gvisor_plane: Plane) -> None:
    session = await gvisor_plane.client.create_session(pids=PIDS)
    try:
        out = await bash(gvisor_plane, session.id, f"python3 - <<'PY'\n{FORKS}\nPY")
        started, refused = (int(n) for n in out.split())
        # The tool uid's own processes (the shell, python3) count too: fewer than PIDS children start.
        assert PIDS - 8 <= started < PIDS, out
        assert refused == 100 - started, out
        assert await bash(gvisor_plane, session.id, "echo fine") == "fine\n"
        assert (await gvisor_plane.client.get_session(session.id)).state == session_pb2.Session.READY
        host = docker.from_env().containers.get(f"ocsb-{gvisor_plane.instance}-{session.sandbox_id}")
        config = host.attrs["HostConfig"]
        assert config["PidsLimit"] == gvisor_limits.HOST_TASKS_BASE + PIDS * gvisor_limits.HOST_TASKS_PER_PROCESS
        assert [(u["Name"], u["Soft"], u["Hard"]) for u in config["Ulimits"]] == [("nproc", PIDS, PIDS)]
    finally:
        await gvisor_plane.client.delete_session(session.id)


async def test_many_short_lived_processes_do_not_lose_the_sandbox(gvisor_plane: Plane) -> None:
    # What the escape suite's order did: hundreds of short-lived processes, setuid binaries caught on a pipe and
    # killed. Under the old host limit (the session's 512) the Sentry's stubs outgrew it and the sandbox was lost.
    session = await gvisor_plane.client.create_session()
    try:
        for _ in range(3):
            out = await bash(gvisor_plane, session.id, (
                "for i in $(seq 60); do /bin/true; done; find / -xdev -perm -4000 -type f 2>/dev/null | wc -l;"
                " for b in chfn chsh newgrp passwd su; do sleep 5 | /usr/bin/$b >/dev/null 2>&1 & p=$!;"
                " sleep 0.2; kill -9 $p; done 2>/dev/null; echo done"
            ))
            assert out.endswith("done\n"), out
        assert await bash(gvisor_plane, session.id, "echo fine") == "fine\n"
    finally:
        await gvisor_plane.client.delete_session(session.id)
