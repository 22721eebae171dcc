"""sandbox_agent.pidfds: the stand-in for a pidfd where the kernel has none (gVisor's, as Debian ships it)."""

from __future__ import annotations

import errno
import os
import select
import subprocess
import time
from pathlib import Path

import pytest

from sandbox_agent import pidfds


def no_pidfd_open(pid: int, flags: int = 0) -> int:
    raise OSError(errno.ENOSYS, "Function not implemented")


def test_the_stand_in_turns_readable_when_the_process_ends_not_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pidfd_open", no_pidfd_open)
    proc = subprocess.Popen(["sleep", "0.3"])
    started = time.monotonic()
    fd = pidfds.pidfd_for(proc.pid)
    try:
        assert select.select([fd], [], [], 0.1)[0] == []  # still running
        assert select.select([fd], [], [], 10)[0] == [fd]
        assert time.monotonic() - started >= 0.25
        assert proc.wait(1) == 0  # a zombie until now: the caller still reaps it and gets its status
    finally:
        os.close(fd)


def test_a_zombie_is_readable_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a pidfd: a child that exited before anyone asked still has one, readable at once (the agent's
    spawner asks right after starting a command as short as `true`)."""
    monkeypatch.setattr(os, "pidfd_open", no_pidfd_open)
    proc = subprocess.Popen(["true"])
    for _ in range(500):  # until it is a zombie (exited, not reaped)
        if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.01)
    fd = pidfds.pidfd_for(proc.pid)
    try:
        assert select.select([fd], [], [], 0)[0] == [fd]
        assert proc.wait(1) == 0
    finally:
        os.close(fd)


def test_a_process_that_does_not_exist_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pidfd_open", no_pidfd_open)
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(ProcessLookupError):
        pidfds.pidfd_for(proc.pid)


def test_a_real_pidfd_where_the_kernel_has_one() -> None:
    proc = subprocess.Popen(["sleep", "0.05"])
    fd = pidfds.pidfd_for(proc.pid)
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
    finally:
        os.close(fd)
        proc.wait()
