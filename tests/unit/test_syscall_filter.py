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
