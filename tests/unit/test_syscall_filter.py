"""The agent's own seccomp filter (sandbox_agent.syscall_filter), installed in a real child process."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from controlplane.sandbox.confinement import SYSCALL_DENY
from sandbox_agent.syscall_filter import SyscallFilterError, program

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no syscall table")

CHILD = textwrap.dedent("""
    import ctypes, os, platform, subprocess, sys
    from sandbox_agent import syscall_filter
    syscall_filter.install(sys.argv[1].split(","))
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    numbers = syscall_filter._NUMBERS[platform.machine()]
    ctx = ctypes.c_ulong(0)
    results = []
    for name in ("io_setup", "io_uring_setup", "userfaultfd"):
        args = (1, ctypes.byref(ctx)) if name != "userfaultfd" else (0,)
        if name == "io_uring_setup":
            args = (1, ctypes.create_string_buffer(120))
        rc = libc.syscall(numbers[name], *args)
        results.append(f"{name}={rc}/{os.strerror(ctypes.get_errno()) if rc < 0 else ''}")
    # What tools use still works, in the process and in its children (the filter is inherited).
    results.append(subprocess.run(["sh", "-c", "echo child ok"], capture_output=True, text=True).stdout.strip())
    print(" ".join(results))
""")


def run_child(names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, names], capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": "sandbox-image", "PATH": "/usr/bin:/bin"})


def test_denied_calls_fail_with_eperm_and_the_rest_runs() -> None:
    done = run_child(",".join(SYSCALL_DENY))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "io_setup=-1/Operation", "not", "permitted", "io_uring_setup=-1/Operation", "not", "permitted",
        "userfaultfd=-1/Operation", "not", "permitted", "child", "ok",
    ]


def test_unknown_names_and_machines_are_refused_not_skipped() -> None:
    with pytest.raises(SyscallFilterError, match="unknown system calls to deny: io_nothing"):
        program(["io_setup", "io_nothing"], "x86_64")
    with pytest.raises(SyscallFilterError, match="no syscall table for sparc"):
        program(["io_setup"], "sparc")
    assert len(program(SYSCALL_DENY, "x86_64")) % 8 == 0


NAMESPACES = textwrap.dedent("""
    import ctypes, os, platform, subprocess, sys, threading
    from sandbox_agent import syscall_filter
    syscall_filter.install(sys.argv[1].split(","))
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    numbers = syscall_filter._NUMBERS[platform.machine()]
    def outcome(rc):
        if rc == 0:
            os._exit(0)  # a clone that got through: the child leaves at once
        return os.strerror(ctypes.get_errno()) if rc < 0 else "ok"
    print("unshare user:", outcome(libc.unshare(0x10000000)))
    print("unshare mount:", outcome(libc.unshare(0x00020000)))
    print("clone new user:", outcome(libc.syscall(numbers["clone"], 0x10000000 | 17, 0, 0, 0, 0)))
    print("clone new net:", outcome(libc.syscall(numbers["clone"], 0x40000000 | 17, 0, 0, 0, 0)))
    print("clone3:", outcome(libc.syscall(numbers["clone3"], 0, 0)))
    print("chroot:", outcome(libc.chroot(b"/")))
    print("setns:", outcome(libc.setns(os.open("/proc/self/ns/mnt", os.O_RDONLY), 0)))
    print("mount:", outcome(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
    # Threads (glibc tries clone3, gets ENOSYS, falls back to clone) and forks still work.
    seen = []
    worker = threading.Thread(target=seen.append, args=("thread ok",))
    worker.start(); worker.join()
    print(seen[0])
    print(subprocess.run(["sh", "-c", "echo fork ok"], capture_output=True, text=True).stdout.strip())
""")


def test_namespaces_mounts_and_chroot_are_refused_and_threads_still_start() -> None:
    """As the engine's default profile refuses them on runc (gVisor does not apply that profile): the test runs
    as root here, so only the filter can be what refuses them."""
    done = subprocess.run([sys.executable, "-c", NAMESPACES, ",".join(SYSCALL_DENY)], capture_output=True,
                          text=True, timeout=30, env={"PYTHONPATH": "sandbox-image", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "unshare user: Operation not permitted", "unshare mount: Operation not permitted",
        "clone new user: Operation not permitted", "clone new net: Operation not permitted",
        "clone3: Function not implemented", "chroot: Operation not permitted", "setns: Operation not permitted",
        "mount: Operation not permitted", "thread ok", "fork ok",
    ]
