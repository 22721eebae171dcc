"""No shared kernel state between sandboxes (issue 22, part 3), attacked through the public API, on runc and
on gVisor (issue 22, part 4: both tenants' `[[tenants]]` entries say `runtime = "runsc"`).

Two tenants on one Docker plane, one session each: A attacks, B is the other tenant's sandbox. The attacks
were real on the platform before: 128 `inotify_init1` in A made the call fail in B and for the host user
of uid 1000 (every sandbox's tool uid was 1000); a loop of `io_setup` took the host's AIO contexts;
/sys/block named every session's disk image and showed its writes.
"""

from __future__ import annotations

import base64
import ctypes
import os
import secrets
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from controlplane.client import AsyncClient
from controlplane.sandbox.tool_ids import host_ids
from tests.planes import Plane, running_plane
from tests.runtimes import RUNTIMES, skip_unless_usable
from tests.security.conftest import python_probe, through_bash_tool
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.docker

INOTIFY_FLOOD = """
import ctypes, errno, os, sys, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
held = []
while len(held) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
print(len(held), errno.errorcode.get(ctypes.get_errno()), flush=True)
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))  # held while the others try
"""

AIO_FLOOD = """
import ctypes, errno
libc = ctypes.CDLL("libc.so.6", use_errno=True)
ctx = ctypes.c_ulong(0)
made = 0
for _ in range(70000):
    ctx.value = 0
    if libc.syscall(206, 1, ctypes.byref(ctx)) != 0:
        break
    made += 1
print(made, errno.errorcode.get(ctypes.get_errno()))
"""

SCAN = r"""
import base64, os, sys, time
# Given encoded: the plain needles would be in this command's own /proc/PID/cmdline.
needles = {base64.b64decode(n).decode(): base64.b64decode(n) for n in sys.argv[1:]}
found = {}
deadline = time.monotonic() + 40
seen = 0
for root in ("/sys", "/proc"):
    for path, dirs, files in os.walk(root):
        if time.monotonic() > deadline:
            print("TIMEOUT"); sys.exit(1)
        parts = path.split("/")
        # Only this sandbox's processes are there (its pid namespace); their mount tables are read below.
        if root == "/proc" and len(parts) == 3 and parts[2].isdigit():
            dirs[:] = []
        for name in files:
            full = os.path.join(path, name)
            try:
                with open(full, "rb") as f:
                    data = f.read(1 << 16)
            except OSError:
                continue
            seen += 1
            for label, needle in needles.items():
                if needle in data:
                    found.setdefault(label, []).append(full)
for extra in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/self/cgroup", "/proc/self/environ"):
    try:
        data = open(extra, "rb").read()
    except OSError:
        continue
    for label, needle in needles.items():
        if needle in data:
            found.setdefault(label, []).append(extra)
print("files read:", seen)
for label, paths in sorted(found.items()):
    print("FOUND", label, sorted(set(paths))[:5])
"""


@dataclass(frozen=True)
class Neighbours:
    runtime: str
    plane: Plane
    a: AsyncClient
    b: AsyncClient
    a_session: str
    a_sandbox: str
    b_session: str
    b_sandbox: str
    b_tenant: str


@pytest.fixture(scope="module", params=RUNTIMES)
async def neighbours(request: pytest.FixtureRequest) -> AsyncIterator[Neighbours]:
    runtime: str = request.param
    skip_unless_usable(runtime)
    chosen = {"runtime": runtime} if runtime != "runc" else {}
    tenants = [{"name": f"alpha-{secrets.token_hex(4)}", "token": secrets.token_hex(16), **chosen},
               {"name": f"beta-{secrets.token_hex(4)}", "token": secrets.token_hex(16), **chosen}]
    async with running_plane("docker", tenants=tenants, pool={"size": 1, "refill_concurrency": 1}) as plane:
        a = AsyncClient(plane.plane.address, str(tenants[0]["token"]))
        b = AsyncClient(plane.plane.address, str(tenants[1]["token"]))
        sa = await a.create_session()
        sb = await b.create_session()
        try:
            yield Neighbours(runtime, plane, a, b, sa.id, sa.sandbox_id, sb.id, sb.sandbox_id, str(tenants[1]["name"]))
        finally:
            await a.delete_session(sa.id)
            await b.delete_session(sb.id)
            await a.close()
            await b.close()


def proc_number(path: str) -> int:
    """A host-wide kernel counter or limit (the test runs on the engine's host)."""
    return int(Path(path).read_text())


def on_host_as(uid: int, code: str) -> str:
    """`code` run by a fresh host Python process under `uid` (the test runs as root, as the provider needs)."""
    done = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=60, user=uid,
                          group=uid, extra_groups=[])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


async def test_every_sandbox_has_a_tool_uid_block_of_its_own(neighbours: Neighbours) -> None:
    n = neighbours
    instance = n.plane.instance
    a_uid, b_uid = tool_uid(instance, n.a_sandbox), tool_uid(instance, n.b_sandbox)
    assert a_uid != b_uid
    assert abs(a_uid - b_uid) >= 8  # whole blocks: the servers' uids follow the tool uid
    for client, session, uid in ((n.a, n.a_session, a_uid), (n.b, n.b_session, b_uid)):
        # (os.stat: gVisor's 2022 kernel refuses coreutils' statx on the workspace mount)
        owner = "import os; s = os.stat('/workspace'); print(f'{s.st_uid}:{s.st_gid}')"
        out = await through_bash_tool(client, session, f'id -u; id -g; python3 -c "{owner}"')
        assert out == f"{uid}\n{uid}\n{uid}:{uid}\n"
    assert not {a_uid, b_uid} & (host_ids(Path("/etc/passwd")) | {1000})


async def test_the_tenants_runtime_is_the_sandboxes_runtime(neighbours: Neighbours) -> None:
    n = neighbours
    engine = docker.from_env()
    for sandbox in (n.a_sandbox, n.b_sandbox):
        container = engine.containers.get(f"ocsb-{n.plane.instance}-{sandbox}")
        assert container.attrs["HostConfig"]["Runtime"] == n.runtime
    kernel = await through_bash_tool(n.a, n.a_session, "cat /proc/version")
    # gVisor's own kernel answers under runsc (it reports itself as Linux 4.4.0); the host's under runc.
    assert kernel.startswith("Linux version 4.4.0") == (n.runtime == "runsc"), kernel


async def test_inotify_exhaustion_stays_in_its_sandbox(neighbours: Neighbours) -> None:
    n = neighbours
    limit = proc_number("/proc/sys/fs/inotify/max_user_instances")
    # A holds every inotify instance its uid may have, in the background, for 30 s.
    started = await through_bash_tool(n.a, n.a_session, (
        "cat > /tmp/flood.py <<'PY'\n" + INOTIFY_FLOOD.strip().replace("100000", str(limit + 64)) + "\nPY\n"
        "(python3 /tmp/flood.py 30 > /tmp/flood.out 2>&1 &); "
        "for i in $(seq 100); do [ -s /tmp/flood.out ] && break; sleep 0.1; done; cat /tmp/flood.out"
    ))
    held, error = started.split()
    if n.runtime == "runc":  # the host's per-user limit, reached (not a file descriptor limit)
        assert error == "EMFILE"
        assert limit - 8 <= int(held) <= limit
    else:  # gVisor's own inotify: the host's table is not involved, whatever gVisor allows
        assert int(held) > 0
    # B (the other tenant) and the host user of uid 1000 still get theirs.
    b_out = await through_bash_tool(n.b, n.b_session, python_probe(INOTIFY_FLOOD.replace("100000", "5")))
    assert b_out == "5 None\n"
    assert on_host_as(1000, INOTIFY_FLOOD.replace("100000", "5")) == "5 None"
    if n.runtime == "runc":  # A itself is still limited (its uid's table is full while the flood holds it)
        again = await through_bash_tool(n.a, n.a_session, python_probe(INOTIFY_FLOOD.replace("100000", "5")))
        assert again.split()[1] == "EMFILE"
    await through_bash_tool(n.a, n.a_session, "pkill -f /tmp/flood.py; true")


async def test_aio_exhaustion_is_refused_and_the_host_keeps_its_contexts(neighbours: Neighbours) -> None:
    n = neighbours
    before = proc_number("/proc/sys/fs/aio-nr")
    out = await through_bash_tool(n.a, n.a_session, python_probe(AIO_FLOOD))
    assert out == "0 EPERM\n"  # the platform's syscall filter: not one context taken
    assert proc_number("/proc/sys/fs/aio-nr") <= before + 64  # (another process on the host may use a few)
    assert await through_bash_tool(n.b, n.b_session, python_probe(AIO_FLOOD.replace("70000", "1"))) == "0 EPERM\n"
    # The host's root still gets its contexts.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    ctx = ctypes.c_ulong(0)
    assert libc.syscall(206, 1, ctypes.byref(ctx)) == 0, os.strerror(ctypes.get_errno())
    assert libc.syscall(207, ctx) == 0  # io_destroy


async def test_a_scan_of_sys_and_proc_finds_no_other_sandbox(neighbours: Neighbours) -> None:
    n = neighbours
    await through_bash_tool(n.b, n.b_session, "head -c 4M /dev/urandom > /workspace/busy.bin; sync; echo ok")
    data_dir = str(n.plane.plane.settings.data_dir)
    # Nothing names the data dir either: A's own socket dir and account files are bound from a tmpfs of their
    # own (sandbox/dir_mounts.py), so A's mount table shows `/` on a tmpfs where runc showed the host path.
    needles = [n.b_sandbox, n.b_session, n.b_tenant, data_dir, f"{data_dir}/disks",
               f"{data_dir}/sandboxes/{n.b_sandbox}"]
    encoded = [base64.b64encode(needle.encode()).decode() for needle in needles]
    out = await through_bash_tool(n.a, n.a_session, python_probe(SCAN, *encoded))
    lines = out.splitlines()
    assert lines[0].startswith("files read: "), out
    # The scan really read /sys and /proc (gVisor's are small: its own kernel's, with no devices at all).
    assert int(lines[0].split(": ")[1]) > (1000 if n.runtime == "runc" else 100)
    assert lines[1:] == [], out


MOUNTS = """
import sys
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    point, root, source = fields[4], fields[3], fields[fields.index("-") + 2]
    if point in sys.argv[1:]:
        print(point, root, source)
"""


async def test_the_sandboxes_own_mounts_name_no_host_path(neighbours: Neighbours) -> None:
    """Gap 5: each of A's own mounts (workspace disk, /tmp, the code tmpfs, the socket dir, the account files)
    shows the root of its filesystem, never where the control plane keeps it on the host."""
    n = neighbours
    points = ["/workspace", "/tmp", "/run/code", "/run/agent", "/etc/passwd", "/etc/group"]
    out = await through_bash_tool(n.a, n.a_session, python_probe(MOUNTS, *points))
    seen = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert sorted(seen) == sorted(points), out
    data_dir = str(n.plane.plane.settings.data_dir)
    for point, (root, source) in seen.items():
        # a file bound from the sandbox's own tmpfs shows its name in that filesystem, a dir its root
        assert root in ("/", f"/{point.rsplit('/', 1)[1]}"), (point, root, out)
        assert data_dir not in source, (point, source, out)
