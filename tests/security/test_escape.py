"""Escape attempts from inside a real session sandbox: every one must fail or stay inside the container.

Each test runs its attack through every vector (conftest.py) and compares what it printed with the exact
refusal this engine and image give. Addresses probed: only listeners the test opened on this machine's
loopback and docker0 bridge address.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.planes import Plane, container_gone
from tests.security.conftest import (
    Pair,
    Vector,
    new_session,
    python_probe,
    through_bash_tool,
)
from tests.security.escape_probes import NETWORK_PROBE, Listener, listeners, on_gvisor, reasons  # noqa: F401
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.docker

AGENT_PID = "$(pgrep -xf 'python3 -m sandbox_agent')"

SPAWNER_PID = "$(pgrep -u $(id -u) -f '^/usr/bin/python3 -I -S -B -c .*sandbox_agent.spawner')"


async def test_runtime_facts_of_a_tool_process(
    runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str,
) -> None:
    out = await vector.run(runtime_plane.client, pair.a, (
        "id; grep -E '^(CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status;"
        f" grep -E '^(Uid|CapEff):' /proc/{AGENT_PID}/status"
    ))
    uid = tool_uid(runtime_plane.instance, pair.a_sandbox)  # the sandbox's own, no host account's (tool_ids.py)
    expected = (
        f"uid={uid}(tool) gid={uid}(tool) groups={uid}(tool)\n"
        "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
        "CapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
        # The agent is uid 0 holding only SETGID, SETUID and KILL (bits 6, 7 and 5).
        "Uid:\t0\t0\t0\t0\nCapEff:\t00000000000000e0\n"
    )
    if runtime == "runsc":
        # gVisor's status lacks CapAmb and NoNewPrivs: the flag and the ambient set are asked with prctl.
        expected = expected.replace("CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n", "")
        flags = await vector.run(runtime_plane.client, pair.a, python_probe(
            "import ctypes; libc = ctypes.CDLL(None)\n"
            "print(libc.prctl(39, 0, 0, 0, 0), [libc.prctl(47, 2, c, 0, 0) for c in range(41)].count(1))"))
        assert flags == "1 0\n"  # PR_GET_NO_NEW_PRIVS, and no capability is ambient
    assert out == expected


async def test_docker_socket_is_not_there(runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str) -> None:
    out = await vector.run(runtime_plane.client, pair.a, (
        "ls -l /var/run/docker.sock /run/docker.sock; echo \"DOCKER_HOST=${DOCKER_HOST-unset}\";"
        " find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null; echo end of sockets;\n"
        + python_probe("""
import socket
for path in ("/var/run/docker.sock", "/run/docker.sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        print(path, "CONNECTED")
    except OSError as e:
        print(path, type(e).__name__)
""")
    ))
    expected = (
        "ls: cannot access '/var/run/docker.sock': No such file or directory\n"
        "ls: cannot access '/run/docker.sock': No such file or directory\n"
        "DOCKER_HOST=unset\nend of sockets\n"
        "/var/run/docker.sock FileNotFoundError\n/run/docker.sock FileNotFoundError\n"
    )
    if runtime == "runsc":
        expected = on_gvisor(expected)
        found = await reasons(runtime_plane, pair.a, vector, "/var/run/docker.sock", "/run/docker.sock")
        assert found == {"/var/run/docker.sock": "ENOENT", "/run/docker.sock": "ENOENT"}
    assert out == expected


@pytest.fixture
def host_marker() -> Iterator[Path]:
    """A file on the host (its real /tmp) that no sandbox may see."""
    path = Path(f"/tmp/ocsb-host-marker-{secrets.token_hex(4)}")
    path.write_text("host secret\n")
    yield path
    path.unlink()


async def test_host_files_are_not_visible(
    runtime_plane: Plane, pair: Pair, vector: Vector, host_marker: Path, runtime: str,
) -> None:
    out = await vector.run(runtime_plane.client, pair.a, (
        f"cat {host_marker}; cat /etc/shadow; ls /proc/1/root/; cat /etc/hostname; ls /var/lib/docker;"
        " ls /host /rootfs 2>&1 | sort"
    ))
    expected = (
        f"cat: {host_marker}: No such file or directory\n"
        "cat: /etc/shadow: Permission denied\n"
        "ls: cannot access '/proc/1/root/': Permission denied\n"
        "sandbox\n"
        "ls: cannot access '/var/lib/docker': No such file or directory\n"
        "ls: cannot access '/host': No such file or directory\n"
        "ls: cannot access '/rootfs': No such file or directory\n"
    )
    if runtime == "runsc":
        expected = on_gvisor(expected)
        found = await reasons(runtime_plane, pair.a, vector, "/proc/1/root/", "/var/lib/docker", "/host", "/rootfs")
        assert found == {"/proc/1/root/": "EACCES", "/var/lib/docker": "ENOENT", "/host": "ENOENT",
                         "/rootfs": "ENOENT"}
    assert out == expected


async def test_another_sessions_workspace_and_socket_are_unreachable(
    runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str,
) -> None:
    theirs, ours = f"NEIGHBOUR-{secrets.token_hex(6)}", f"OWN-{secrets.token_hex(6)}"
    wrote = await vector.run(runtime_plane.client, pair.b, f"echo {theirs} > /workspace/neighbour.txt && echo ok")
    assert wrote == "ok\n"
    b_socket_dir = runtime_plane.plane.settings.data_dir / "sandboxes" / pair.b_sandbox
    assert (b_socket_dir / "frames.sock").is_socket()  # the agent's one socket (it serves no gRPC on Docker)
    search = "grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev"
    out = await vector.run(runtime_plane.client, pair.a, (
        f"echo {ours} > /workspace/own.txt; {search} {ours} /; echo --; {search} {theirs} /; echo --;"
        f" find / \\( -path /proc -o -path /sys \\) -prune -o \\( -name '*{pair.b_sandbox}*' -o"
        f" -name '*{pair.b}*' \\) -print 2>/dev/null; echo --;"
        f" grep -c -e {pair.b_sandbox} -e {pair.b} /proc/self/mountinfo; ls {b_socket_dir}; ls /run/agent;"
        " awk 'NR > 1 && $8 != \"\" { print $8 }' /proc/net/unix | sort"
    ))
    # The positive control (our own marker is found) shows the search sees what there is to see.
    expected = (
        "/workspace/own.txt\n--\n--\n--\n0\n"
        f"ls: cannot access '{b_socket_dir}': No such file or directory\n"
        "ls: cannot open directory '/run/agent': Permission denied\n"
        "/run/agent/frames.sock\n"
    )
    if runtime == "runsc":
        expected = on_gvisor(expected)
        found = await reasons(runtime_plane, pair.a, vector, str(b_socket_dir), "/run/agent")
        assert found == {str(b_socket_dir): "ENOENT", "/run/agent": "EACCES"}
    assert out == expected


async def test_control_plane_data_dir_and_token_are_unreachable(
    runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str,
) -> None:
    data_dir = runtime_plane.plane.settings.data_dir
    token = runtime_plane.token
    store = sorted(p.name for p in data_dir.iterdir() if p.is_file())
    assert "default.token" in store
    probes = " ".join(f"{data_dir}/{name}" for name in store)
    out = await vector.run(runtime_plane.client, pair.a, (
        f"ls {data_dir}; cat {probes} 2>&1 | sed 's/^cat: //'; env | grep -c -F {token};"
        f" grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {token} /; echo searched"
    ))
    expected = (
        f"ls: cannot access '{data_dir}': No such file or directory\n"
        + "".join(f"{data_dir}/{name}: No such file or directory\n" for name in store)
        + "0\nsearched\n"
    )
    if runtime == "runsc":
        expected = on_gvisor(expected)
        assert await reasons(runtime_plane, pair.a, vector, str(data_dir)) == {str(data_dir): "ENOENT"}
    assert out == expected


async def test_network_reaches_nothing_outside(
    runtime_plane: Plane, pair: Pair, vector: Vector, listeners: dict[str, Listener], runtime: str,  # noqa: F811
) -> None:
    bridge, loop = listeners["docker0"], listeners["loopback"]
    args = (bridge.host, str(bridge.tcp_port), str(bridge.udp_port), str(loop.tcp_port), str(loop.udp_port))
    script = python_probe(NETWORK_PROBE, *args) + "getent hosts example.com; echo getent=$?"
    out = await vector.run(runtime_plane.client, pair.a, script)
    expected = (
        "interfaces: lo\nroutes: 0\n"
        "tcp docker0 ENETUNREACH\nudp docker0 ENETUNREACH\n"
        # 127.0.0.1 inside is the sandbox's own loopback: refused there, and the datagram dies there.
        "tcp loopback ECONNREFUSED\nudp loopback sent\n"
        "resolve EAI_AGAIN\n"
        "getent=2\n"
    )
    if runtime == "runsc":  # gVisor's netstack says host unreachable for no route; nothing arrives either way
        expected = expected.replace("docker0 ENETUNREACH", "docker0 EHOSTUNREACH")
    assert out == expected
    await asyncio.sleep(0.2)
    assert bridge.hits == []
    assert loop.hits == []


SYSCALL_PROBE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
agent, spawner = int(sys.argv[1]), int(sys.argv[2])
def report(name, rc):
    print(f"{name}: " + ("SUCCEEDED" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")))
report("mount tmpfs", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
report("mount --bind", libc.mount(b"/", b"/workspace", None, 4096, None))
report("unshare user", libc.unshare(0x10000000))
report("unshare mount", libc.unshare(0x00020000))
report("unshare net", libc.unshare(0x40000000))
report("ptrace attach agent", libc.ptrace(16, agent, None, None))
report("ptrace seize agent", libc.ptrace(0x4206, agent, None, None))
report("ptrace attach spawner", libc.ptrace(16, spawner, None, None))
report("kill agent", libc.kill(agent, 9))
report("kill init", libc.kill(1, 9))
report("init_module", libc.syscall(175, None, 0, b""))
report("finit_module", libc.syscall(313, 0, b"", 0))
report("delete_module", libc.syscall(176, b"ext4", 0))
report("kexec_load", libc.syscall(246, 0, 0, None, 0))
report("setuid 0", libc.setuid(0))
report("chroot", libc.chroot(b"/tmp"))
ns = "/proc/self/ns/mnt" if os.path.exists("/proc/self/ns/mnt") else "/"  # gVisor has no namespace files
report("setns", libc.syscall(308, os.open(ns, os.O_RDONLY), 0))
"""


async def test_privileged_syscalls_fail(runtime_plane: Plane, pair: Pair, vector: Vector) -> None:
    # The same answers on gVisor: the platform's filter refuses namespaces, mounts and chroot there (gVisor does
    # not apply the engine's profile; before, `unshare user` succeeded and the later calls ran as root of that
    # namespace: ENOSYS for modules, EINVAL for setuid 0, chroot SUCCEEDED).
    out = await vector.run(runtime_plane.client, pair.a, python_probe(SYSCALL_PROBE, AGENT_PID, SPAWNER_PID))
    names = [line.partition(":")[0] for line in SYSCALL_PROBE.splitlines() if line.startswith("report(")]
    assert len(names) == 17
    assert out == "".join(f"{name}: EPERM\n" for name in (n.split('"')[1] for n in names))


PROC_PROBE = """
import os, sys
for pid in sys.argv[1:]:
    for name in ("environ", "mem", "maps", "auxv", "stack"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                f.read(1)
            print(pid, name, "READ")
        except OSError as e:
            print(pid, name, type(e).__name__)
    for name in ("cwd", "exe", "root"):
        try:
            print(pid, name, os.readlink(f"/proc/{pid}/{name}"))
        except OSError as e:
            print(pid, name, type(e).__name__)
    try:
        print(pid, "fd", os.listdir(f"/proc/{pid}/fd"))
    except OSError as e:
        print(pid, "fd", type(e).__name__)
"""


async def test_agent_process_is_out_of_reach(runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str) -> None:
    script = (
        f"A={AGENT_PID}; S={SPAWNER_PID}; echo \"agent=$A spawner=$S\"; kill -9 $A; kill -STOP $A; kill -9 1;\n"
        + python_probe(PROC_PROBE, "$A", "$S", "1")
        + "grep -E '^(State|TracerPid):' /proc/$A/status; echo agent=$(pgrep -xf 'python3 -m sandbox_agent')"
    )
    out = (await vector.run(runtime_plane.client, pair.a, script)).splitlines()
    pids = dict(word.split("=") for word in out[0].split())
    agent, spawner = pids["agent"], pids["spawner"]
    assert agent.isdigit()
    assert spawner.isdigit()
    denied = [
        f"{pid} {name} PermissionError"
        for pid in (agent, spawner, "1")
        for name in ("environ", "mem", "maps", "auxv", "stack", "cwd", "exe", "root", "fd")
    ]
    if runtime == "runsc":
        # Gap 7 (docs/security.md): Debian's runsc lets any uid read environ, maps, auxv and the fd list, and has
        # no stack file; mem, cwd, exe, root, signals and ptrace stay refused. What the agent's environ shows is
        # blank (test_escape_gvisor.py), its fds cannot be opened.
        shown = {"environ": "READ", "maps": "READ", "auxv": "READ", "stack": "FileNotFoundError"}
        denied = [line if line.split()[1] not in shown else f"{line.rsplit(' ', 1)[0]} {shown[line.split()[1]]}"
                  for line in denied]
        fd_lines = [line for line in out if line.split()[1:2] == ["fd"]]
        assert [line.split(" ", 2)[:2] for line in fd_lines] == [[p, "fd"] for p in (agent, spawner, "1")]
        out = [line if line not in fd_lines else f"{line.split()[0]} fd PermissionError" for line in out]
    # Not stopped (T) nor traced (t): sleeping, or running when it serves at that moment (seen on gVisor in CI).
    state = out[-3]
    assert state in ("State:\tS (sleeping)", "State:\tR (running)"), state
    assert out[1:-3] + out[-2:] == [
        f"/bin/bash: line 1: kill: ({agent}) - Operation not permitted",
        f"/bin/bash: line 1: kill: ({agent}) - Operation not permitted",
        "/bin/bash: line 1: kill: (1) - Operation not permitted",
        *denied,
        "TracerPid:\t0",
        f"agent={agent}",
    ]


async def test_mount_and_unshare_commands_fail(runtime_plane: Plane, pair: Pair, vector: Vector) -> None:
    out = await vector.run(runtime_plane.client, pair.a, (
        "mkdir -p /tmp/mnt; mount -t tmpfs none /tmp/mnt; mount -o remount,rw /; umount /workspace;"
        " unshare -r id; unshare -m true; unshare -n true; echo done"
    ))
    superuser = "\n       dmesg(1) may have more information after failed mount system call.\n"
    assert out == (
        "mount: /tmp/mnt: must be superuser to use mount." + superuser
        + "mount: /: must be superuser to use mount." + superuser
        + "umount: /workspace: must be superuser to unmount.\n"
        + "unshare: unshare failed: Operation not permitted\n" * 3
        + "done\n"
    )


async def test_writes_outside_workspace_fail(runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str) -> None:
    targets = ["/", "/etc", "/usr", "/usr/local/bin", "/opt/agent", "/opt/agent/sandbox_agent", "/node_modules",
               "/run", "/run/lock", "/var/tmp", "/root"]
    out = await vector.run(runtime_plane.client, pair.a, (
        f"for d in {' '.join(targets)}; do touch $d/.escape 2>&1 | sed 's/^touch: //'; done;"
        " echo x >> /opt/agent/sandbox_agent/server.py; echo x >> /usr/local/bin/bun;"
        " find / \\( -path /proc -o -path /sys \\) -prune -o -type d -writable -print 2>/dev/null"
        " | grep -v -e '^/workspace/' -e '^/tmp/' | sort"
    ))
    refusals = [f"cannot touch '{d}/.escape': Read-only file system" for d in targets]  # '//.escape' for the root
    refusals[targets.index("/root")] = "cannot touch '/root/.escape': Permission denied"
    writable = ["/dev/mqueue", "/dev/shm", "/tmp", "/workspace"]
    if runtime == "runsc":
        # gVisor checks a dir's permissions before the filesystem's read-only flag: the root-owned dirs answer
        # "Permission denied"; the world-writable ones on the same root (/run/lock, /var/tmp) show it read-only.
        # Its /dev has no mqueue mount.
        refusals = [r if "/run/lock/" in r or "/var/tmp/" in r else r.replace("Read-only file system",
                                                                               "Permission denied") for r in refusals]
        writable.remove("/dev/mqueue")
    assert out.splitlines() == [
        *refusals,
        "/bin/bash: line 1: /opt/agent/sandbox_agent/server.py: Permission denied",
        "/bin/bash: line 1: /usr/local/bin/bun: Permission denied",
        # Writable: the workspace, the /tmp tmpfs, and Docker's private per-container IPC mounts.
        *writable,
    ]


SETUID_BINARIES = ["/usr/bin/chfn", "/usr/bin/chsh", "/usr/bin/gpasswd", "/usr/bin/mount", "/usr/bin/newgrp",
                   "/usr/bin/passwd", "/usr/bin/su", "/usr/bin/umount"]
SETGID_BINARIES = ["/usr/bin/chage", "/usr/bin/expiry", "/usr/sbin/unix_chkpwd"]


async def test_setuid_and_setgid_binaries_do_not_elevate(runtime_plane: Plane, pair: Pair, vector: Vector) -> None:
    # A binary that waits on stdin is caught while running and its uids read; the others fail at what
    # only their file owner may do.
    out = await vector.run(runtime_plane.client, pair.a, (
        "find / -xdev -perm -4000 -type f 2>/dev/null | sort; echo --; find / -xdev -perm -2000 -type f 2>/dev/null"
        " | sort; echo --; for b in chfn chsh newgrp passwd su; do sleep 5 | /usr/bin/$b >/dev/null 2>&1 & p=$!;"
        " for i in $(seq 50); do [ \"$(cat /proc/$p/comm 2>/dev/null)\" = $b ] && break; sleep 0.02; done;"
        " sleep 0.1; echo \"$b $(grep ^Uid /proc/$p/status | tr '\\t' ' ')\"; kill -9 $p; done 2>/dev/null;"
        " chage -l tool; gpasswd -r tool; expiry -c; echo expiry=$?"
    ))
    uid = tool_uid(runtime_plane.instance, pair.a_sandbox)
    assert out == (
        "\n".join(SETUID_BINARIES) + "\n--\n" + "\n".join(SETGID_BINARIES) + "\n--\n"
        + "".join(f"{b} Uid: {uid} {uid} {uid} {uid}\n" for b in ("chfn", "chsh", "newgrp", "passwd", "su"))
        + "chage: cannot open /etc/shadow\ngpasswd: cannot open /etc/gshadow\n"
        + "expiry=0\n"
    )


async def test_kernel_modules_and_sysctls_cannot_be_touched(
    runtime_plane: Plane, pair: Pair, vector: Vector, runtime: str,
) -> None:
    out = await vector.run(runtime_plane.client, pair.a, (
        "command -v modprobe insmod; ls /lib/modules;"
        " for f in /proc/sys/kernel/modprobe /proc/sys/net/ipv4/ip_forward /proc/sys/kernel/core_pattern"
        " /proc/sysrq-trigger /sys/kernel/uevent_helper; do (echo 1 > $f) 2>&1 | sed 's/^.*: //'; done;"
        " cat /proc/sys/net/ipv4/ip_forward"
    ))
    lines = out.splitlines()
    if runtime == "runsc":
        assert await reasons(runtime_plane, pair.a, vector, "/lib/modules") == {"/lib/modules": "ENOENT"}
        lines[0] = lines[0].replace("Invalid argument", "No such file or directory")  # on_gvisor's statx quirk
    assert lines[0] == "ls: cannot access '/lib/modules': No such file or directory"
    if runtime == "runsc":  # gVisor checks the root-owned files' permissions before the read-only flag
        assert lines[1:6] == ["Permission denied"] * 5
        lines[1:6] = ["Read-only file system"] * 5
    # modprobe, sysrq and uevent_helper may be missing from this kernel altogether; what exists is read-only.
    assert all(line in ("Read-only file system", "No such file or directory") for line in lines[1:6]), lines
    assert lines[2] == "Read-only file system"
    assert lines[6] in ("0", "1")
    assert len(lines) == 7


async def test_killing_the_spawner_helper_only_hurts_the_own_session(
    runtime_plane: Plane, vector: Vector
) -> None:
    # The helper runs as the tool user (spawner.py's trust note): a tool may kill it; the agent replaces it.
    session = await new_session(runtime_plane.client)
    try:
        before = await vector.run(runtime_plane.client, session.id, f"echo {SPAWNER_PID}")
        out = await vector.run(runtime_plane.client, session.id, f"kill -9 {SPAWNER_PID} && echo killed")
        assert out == "killed\n"
        # A custom tool's host was started before the kill and spawns its own children: it needs no helper.
        assert await vector.run(runtime_plane.client, session.id, "echo alive") == "alive\n"
        after = await through_bash_tool(runtime_plane.client, session.id, f"echo {SPAWNER_PID}; echo alive")
        assert after.splitlines()[1:] == ["alive"]
        assert after.splitlines()[0].isdigit()
        assert after.splitlines()[0] != before.strip()
    finally:
        await runtime_plane.client.delete_session(session.id)


async def test_container_is_gone_after_delete(runtime_plane: Plane, vector: Vector) -> None:
    session = await new_session(runtime_plane.client)
    await vector.run(runtime_plane.client, session.id, "sleep 600 >/dev/null 2>&1 & echo started")
    await runtime_plane.client.delete_session(session.id)
    name = f"ocsb-{runtime_plane.instance}-{session.sandbox_id}"
    assert container_gone(name)
    assert not (runtime_plane.plane.settings.data_dir / "sandboxes" / session.sandbox_id).exists()


async def test_javascript_attempts_from_a_custom_tool(
    runtime_plane: Plane, pair: Pair, listeners: dict[str, Listener], host_marker: Path, runtime: str,  # noqa: F811
) -> None:
    # Bun's own APIs, no shell: fetch, Bun.connect, node:fs, process.kill, process.setuid.
    bridge = listeners["docker0"]
    out = await runtime_plane.client.execute_tool(
        pair.a, "probe_js", {"host": bridge.host, "port": bridge.tcp_port, "marker": str(host_marker)}
    )
    assert out.error is None
    expected = [
        # 127.0.0.1 is the sandbox's own loopback; docker0 has no route; there is no resolver to ask.
        "fetch loopback: ECONNREFUSED", "fetch docker0: ENETUNREACH", "fetch docker api: ENOENT",
        "dns lookup: DNS_ECONNREFUSED", "connect docker.sock: ENOENT", "connect agent.sock: EACCES",
        "read host marker: ENOENT", "read /proc/1/environ: EACCES", "read agent environ: EACCES",
        "read agent mem: EACCES", "read /etc/shadow: EACCES", "kill init: EPERM", "kill agent: EPERM",
        "stop agent: EPERM", "setuid 0: EPERM", "write /etc: EROFS", "append agent source: EACCES",
        "write /usr/local/bin: EROFS", "list agent socket dir: EACCES", "agent alive: true",
    ]
    got = out.output.splitlines()
    if runtime == "runsc":
        # gVisor's own words (see the bash vector's tests): no route is EHOSTUNREACH, a root-owned dir on the
        # read-only root answers EACCES first; /proc/PID/environ is readable there (gap 7): init's holds only
        # the container's non-secret names (test_escape_gvisor.py pins them), the agent's is blank.
        words = {"fetch docker0: ENETUNREACH": "fetch docker0: EHOSTUNREACH",
                 "write /etc: EROFS": "write /etc: EACCES",
                 "write /usr/local/bin: EROFS": "write /usr/local/bin: EACCES"}
        expected = [words.get(line, line) for line in expected]
        readable = {"read /proc/1/environ:": "read /proc/1/environ: EACCES",
                    "read agent environ:": "read agent environ: EACCES"}
        for prefix, refusal in readable.items():
            index = next(i for i, line in enumerate(got) if line.startswith(prefix))
            assert got[index].startswith(f"{prefix} SUCCEEDED"), got[index]
            if prefix == "read agent environ:":
                # The agent blanked its environ in place: gVisor reads that region back as NUL bytes.
                assert got[index].removeprefix(f"{prefix} SUCCEEDED").strip(" \x00") == "", got[index]
            got[index] = refusal  # checked above: the rest of the list must match runc's
    assert got == expected
    await asyncio.sleep(0.2)
    assert bridge.hits == []
    assert listeners["loopback"].hits == []
