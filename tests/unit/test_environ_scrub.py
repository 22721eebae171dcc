"""The agent blanks its start-up environment in memory (sandbox_agent.environ_scrub): what /proc/PID/environ
shows, to anyone gVisor lets read it, holds none of it, while the agent and its children keep every value."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, subprocess
    from sandbox_agent import environ_scrub
    before = open(f"/proc/{os.getpid()}/environ", "rb").read()
    environ_scrub.scrub()
    after = open(f"/proc/{os.getpid()}/environ", "rb").read()
    print(b"AGENT_TOOL_UID=200008" in before, b"AGENT_TOOL_UID" in after, len(after.strip(b"\\0")))
    print(os.environ["AGENT_TOOL_UID"], os.getenv("AGENT_SYSCALL_DENY"))
    print(subprocess.run(["sh", "-c", "echo $AGENT_TOOL_UID"], capture_output=True, text=True).stdout.strip())
""")


def test_the_start_up_environment_is_blank_in_proc_and_kept_in_the_process() -> None:
    env = {"PYTHONPATH": "sandbox-image", "PATH": "/usr/bin:/bin", "AGENT_TOOL_UID": "200008",
           "AGENT_SYSCALL_DENY": "io_setup"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True False 0", "200008 io_setup", "200008"]
