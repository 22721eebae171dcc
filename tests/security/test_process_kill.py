"""Stopping a command kills what it started even when it fights back: children that left the group with
setsid or ignore SIGTERM. Run on the host as the current user (no Docker); the fork bomb itself is
tried in a container (test_resources.py), where a pids limit keeps it bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

from sandbox_agent.process import Chunk, ExecSpec, Execution, Identity

ME = Identity(None, None)


def spec(command: str, grace_s: float = 0.2) -> ExecSpec:
    return ExecSpec(argv=["/bin/bash", "-c", command], env={"PATH": os.environ["PATH"]}, cwd="/tmp",
                    timeout_s=None, stdin=False, kill_grace_s=grace_s, merge_stderr=True)


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


async def alive_for(pid: int, bound_s: float) -> float:
    """Seconds until `pid` is no longer running (at most `bound_s`)."""
    started = time.monotonic()
    while True:
        took = time.monotonic() - started
        if not running(pid) or took >= bound_s:
            return took
        await asyncio.sleep(0.005)


def ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        ignored = int(status.read().split("SigIgn:")[1].split()[0], 16)
    return bool(ignored & (1 << (signal.SIGTERM - 1)))


async def ignoring_sigterm(pid: int) -> None:
    """Waits until `pid` ignores SIGTERM (a subshell sets its trap a moment after its parent printed its pid)."""
    deadline = time.monotonic() + 5
    while True:
        if ignores_sigterm(pid):
            return
        assert time.monotonic() < deadline, "the child never ignored SIGTERM"
        await asyncio.sleep(0.005)


async def test_leftovers_deaf_to_sigterm_are_killed_at_once_when_the_command_exits_of_it() -> None:
    # The command dies of the SIGTERM; its child ignores it, so waiting the grace for it would change nothing.
    execution = await Execution.start(spec("(trap '' TERM; exec sleep 300) & echo $!; exec sleep 300", grace_s=3.0),
                                      ME, 1 << 20)
    [child] = await pids_printed(execution, 1)
    try:
        await ignoring_sigterm(child)
        stopping = execution.stop(reason="test")
        assert await alive_for(child, 5.0) < 1.5  # far less than the 3 s grace
        await stopping
        assert not running(child)
        assert not running(execution.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


PYTHON_CLEANING_UP = (
    "import signal, sys, time\n"
    "def cleanup(*_):\n"
    "    time.sleep(0.3)\n"
    "    open(sys.argv[1], 'w').write('cleaned')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, cleanup)\n"
    "print(__import__('os').getpid(), flush=True)\n"
    "time.sleep(300)\n"
)


async def test_a_leftover_handling_sigterm_keeps_the_grace_after_the_command_exited(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    script = tmp_path / "cleanup.py"
    script.write_text(PYTHON_CLEANING_UP)
    execution = await Execution.start(spec(f"python3 {script} {marker} & exec sleep 300", grace_s=3.0), ME, 1 << 20)
    [child] = await pids_printed(execution, 1)
    try:
        await execution.stop(reason="test")
        assert marker.read_text() == "cleaned"  # its handler ran to the end: no SIGKILL cut it short
        assert not running(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


async def test_a_command_blocking_sigterm_gets_the_whole_grace() -> None:
    command = ("exec python3 -c 'import os, signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM});"
               " print(os.getpid(), flush=True); time.sleep(300)'")
    execution = await Execution.start(spec(command, grace_s=0.4), ME, 1 << 20)
    [pid] = await pids_printed(execution, 1)
    assert pid == execution.pid
    stopping = execution.stop(reason="test")
    took = await alive_for(pid, 5.0)
    await stopping
    assert 0.4 <= took < 2.5  # SIGKILL at the end of the grace, not before
