"""The agent's process runner, on the host as the current user (no uid switch)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from pathlib import Path

import pytest

from sandbox_agent.errors import SpawnError
from sandbox_agent.process import Chunk, ExecSpec, Execution, Exit, Identity
from sandbox_agent.process_tree import cgroup_counter

ME = Identity(None, None)


def spec(command: str, **kw: object) -> ExecSpec:
    base: dict[str, object] = {
        "argv": ["/bin/bash", "-c", command], "env": {"PATH": os.environ["PATH"]}, "cwd": "/tmp",
        "timeout_s": None, "stdin": False, "kill_grace_s": 0.2, "merge_stderr": False,
    }
    base.update(kw)
    return ExecSpec(**base)  # type: ignore[arg-type]


async def collect(execution: Execution) -> tuple[bytes, bytes, Exit]:
    out, err = bytearray(), bytearray()
    async for item in execution.events():
        if isinstance(item, Chunk):
            (out if item.stream == "stdout" else err).extend(item.data)
        else:
            return bytes(out), bytes(err), item
    raise AssertionError("no exit")


async def test_exit_code_and_streams() -> None:
    out, err, exit_ = await collect(await Execution.start(spec("echo a; echo b >&2; exit 3"), ME, 1 << 20))
    assert (out, err, exit_.exit_code, exit_.signal) == (b"a\n", b"b\n", 3, 0)


async def test_missing_program_and_cwd_are_clear_errors() -> None:
    with pytest.raises(SpawnError, match="no such file"):
        await Execution.start(spec("", argv=["/no/such/program"]), ME, 1 << 20)
    with pytest.raises(SpawnError, match="does not exist"):
        await Execution.start(spec("true", cwd="/no/such/dir"), ME, 1 << 20)


async def test_background_holder_does_not_hang() -> None:
    started = time.monotonic()
    execution = await Execution.start(spec("sleep 5 & echo hi"), ME, 1 << 20)
    out, _, exit_ = await collect(execution)
    assert out == b"hi\n"
    assert exit_.exit_code == 0
    assert time.monotonic() - started < 2
    execution.stop(reason="cleanup")


async def test_stop_kills_the_group_and_reports_abort() -> None:
    execution = await Execution.start(spec("sleep 100 & sleep 100"), ME, 1 << 20)
    await asyncio.sleep(0.2)
    execution.stop(reason="user pressed stop")
    _, _, exit_ = await collect(execution)
    assert exit_.aborted
    assert exit_.abort_reason == "user pressed stop"
    with pytest.raises(ProcessLookupError):
        os.killpg(execution.pid, 0)


async def test_sigterm_ignored_leads_to_sigkill() -> None:
    execution = await Execution.start(spec("trap '' TERM; sleep 100", kill_grace_s=0.1), ME, 1 << 20)
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await execution.stop(reason="x")
    _, _, exit_ = await collect(execution)
    assert exit_.signal == 9
    assert time.monotonic() - started < 1.5


async def test_timeout_keeps_partial_output() -> None:
    out, _, exit_ = await collect(await Execution.start(spec("echo part; sleep 10", timeout_s=0.2), ME, 1 << 20))
    assert out == b"part\n"
    assert exit_.timed_out
    assert exit_.exit_code == 143


async def test_large_output_with_small_buffer_is_complete_and_ordered() -> None:
    command = "head -c 5000000 /dev/zero | tr '\\0' 'x'"
    out, _, exit_ = await collect(await Execution.start(spec(command), ME, 64 * 1024))
    assert exit_.exit_code == 0
    assert out == b"x" * 5_000_000


async def test_stdin_closed_by_default_and_writable_when_asked() -> None:
    _, _, exit_ = await collect(await Execution.start(spec("cat", timeout_s=5), ME, 1 << 20))
    assert not exit_.timed_out
    execution = await Execution.start(spec("cat", stdin=True, timeout_s=5), ME, 1 << 20)
    await execution.write_stdin(b"ping\n")
    execution.close_stdin()
    out, _, _ = await collect(execution)
    assert out == b"ping\n"


async def test_no_fd_is_leaked_by_runs_and_failed_starts() -> None:
    await collect(await Execution.start(spec("true"), ME, 1 << 20))
    before = len(os.listdir("/proc/self/fd"))
    for kw in ({}, {"stdin": True}, {"merge_stderr": True}):
        await collect(await Execution.start(spec("echo x; echo y >&2", **kw), ME, 1 << 20))
    execution = await Execution.start(spec("cat", stdin=True), ME, 1 << 20)
    await execution.write_stdin(b"abc")
    execution.close_stdin()
    await execution.write_stdin(b"ignored after close")
    out, _, _ = await collect(execution)
    assert out == b"abc"
    with pytest.raises(SpawnError, match=r"^cannot run '/no/such': no such file or directory$"):
        await Execution.start(spec("", argv=["/no/such"], stdin=True), ME, 1 << 20)
    assert len(os.listdir("/proc/self/fd")) == before


async def test_signal_death_reports_128_plus_signal() -> None:
    _, _, exit_ = await collect(await Execution.start(spec("kill -9 $$"), ME, 1 << 20))
    assert (exit_.exit_code, exit_.signal) == (137, 9)


async def test_an_execution_dropped_after_stop_releases_its_fds() -> None:
    await collect(await Execution.start(spec("true"), ME, 1 << 20))
    gc.collect()
    before = open_fds()
    # Reading is paused (nobody consumes the events), so the pipes never see their end.
    execution = await Execution.start(spec("cat /dev/zero", stdin=True), ME, 64 * 1024)
    await asyncio.sleep(0.05)
    assert open_fds() - before, "the execution opened no fds: the check below would prove nothing"
    await execution.stop(reason="client went away")
    del execution
    gc.collect()
    # Compared as (number, what it points at): an fd another test's leftovers close meanwhile (a stopped
    # plane's poller) is no concern here, and a pipe of this execution still open is caught whatever its number.
    assert open_fds() - before == set()


def open_fds() -> set[tuple[str, str]]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return found


def test_cgroup_counter_reads_whichever_file_exists_and_remembers_it(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.events", tmp_path / "memory.oom_control"
    paths = (str(v2), str(v1))
    assert cgroup_counter(paths, b"oom_kill") is None  # neither file: no counter
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    assert cgroup_counter(paths, b"oom_kill") == 3
    v1.write_text("oom_kill 4\n")
    assert cgroup_counter(paths, b"oom_kill") == 4  # the file that answered is read first now
    v1.unlink()
    v2.write_text("low 0\nhigh 0\nmax 0\noom 1\noom_kill 5\n")
    assert cgroup_counter(paths, b"oom_kill") == 5  # the remembered file went away: the others still count
    v2.write_text("oom_kill many\n")
    assert cgroup_counter(paths, b"oom_kill") is None
    assert cgroup_counter(paths, b"absent") is None
