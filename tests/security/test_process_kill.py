"""Stopping a command kills what it started even when it fights back: children that left the group with
setsid or ignore SIGTERM. Run on the host as the current user (no Docker); the fork bomb itself is
tried in a container (test_resources.py), where a pids limit keeps it bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from sandbox_agent.process import Chunk, ExecSpec, Execution, Identity

ME = Identity(None, None)


def spec(command: str) -> ExecSpec:
    return ExecSpec(argv=["/bin/bash", "-c", command], env={"PATH": os.environ["PATH"]}, cwd="/tmp",
                    timeout_s=None, stdin=False, kill_grace_s=0.2, merge_stderr=True)


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a zombie holds no pipe and runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False


async def pids_printed(execution: Execution, count: int) -> list[int]:
    text = b""
    async for item in execution.events():
        assert isinstance(item, Chunk), "the command ended before printing its pids"
        text += item.data
        if text.count(b"\n") >= count:
            return [int(line) for line in text.decode().split()]
    raise AssertionError("no output")


async def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in pids if running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.01)


async def test_setsid_children_that_ignore_sigterm_are_killed_with_their_call() -> None:
    # Each child ignores SIGTERM (inherited across exec) and sits in a session of its own, outside the group.
    script = "trap '' TERM; for i in 1 2 3 4 5; do (trap '' TERM; exec setsid sleep 300) & echo $!; done; sleep 300"
    execution = await Execution.start(spec(script), ME, 1 << 20)
    pids = await pids_printed(execution, 5)
    assert len(pids) == 5
    deadline = time.monotonic() + 5
    while any(os.getsid(p) != p for p in pids if running(p)):  # until each child's setsid() has run
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.01)
    assert all(os.getsid(p) == p for p in pids)
    started = time.monotonic()
    try:
        await execution.stop(reason="test")
        took = time.monotonic() - started
        assert await gone_within(pids, 1.0) == []
        assert 0.2 <= took < 2.5  # the SIGTERM grace, then the kill (scanning the host's /proc can be slow)
    finally:
        for pid in pids:  # whatever survived a failure must not outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
