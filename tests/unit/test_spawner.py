"""The spawner helper with a real uid switch (uid 65534): needs root, as the agent in its container."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox_agent import spawner
from sandbox_agent.errors import SpawnError
from sandbox_agent.process import Chunk, ExecSpec, Execution, Exit, Identity

NOBODY = Identity(65534, 65534)
OLD_PATH = Identity(65534, 65534, via_spawner=False)
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
# The venv's interpreter may live under /root, which uid 65534 cannot enter.
HOST_PYTHON = shutil.which("python3", path="/usr/bin:/bin")

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or HOST_PYTHON is None, reason="needs root (uid switch) and /usr/bin/python3"
)


@pytest.fixture(autouse=True)
async def helper_interpreter(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    monkeypatch.setattr(spawner, "PYTHON", HOST_PYTHON)
    yield
    await Execution.close_spawners()


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory uid 65534 can enter (pytest's tmp_path sits under a private one)."""
    path = Path(tempfile.mkdtemp(dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def spec(command: str, **kw: object) -> ExecSpec:
    base: dict[str, object] = {
        "argv": ["/bin/sh", "-c", command], "env": ENV, "cwd": "/tmp",
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


async def run(command: str, identity: Identity = NOBODY, **kw: object) -> tuple[bytes, bytes, Exit]:
    return await collect(await Execution.start(spec(command, **kw), identity, 1 << 20))


def helper_pid() -> int:
    pid = spawner.shared(65534, 65534).pid
    assert pid is not None
    return pid


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as status:
        return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                fields = stat_file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append((int(entry), fields[0]))
    return found


def exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def open_fds() -> set[tuple[str, str]]:
    """This process's descriptors with what each is (a pipe's inode, a file's path). A leak is one the second
    census has and the first had not: in a suite's process, an earlier test's object collected meanwhile may close
    one of its own (a count then went from 112 to 111, and failed a test that had leaked nothing)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own, closed by now
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return found


async def test_runs_as_the_tool_user_without_groups_with_env_cwd_and_umask(public_dir: Path) -> None:
    os.chmod(public_dir, 0o777)
    out, err, exit_ = await run("id -u; id -g; id -G; umask; pwd; touch f; env | sort", cwd=str(public_dir))
    lines = out.decode().splitlines()
    assert lines[:5] == ["65534", "65534", "65534", "0022", str(public_dir)]
    created = (public_dir / "f").stat()
    assert (created.st_uid, created.st_gid, stat.S_IMODE(created.st_mode)) == (65534, 65534, 0o644)
    env = dict(line.split("=", 1) for line in lines[5:])
    assert (env["PATH"], env["LANG"]) == ("/usr/bin:/bin", "C.UTF-8")
    assert set(env) <= {"PATH", "LANG", "PWD", "OLDPWD", "SHLVL", "_"}  # only what the shell adds
    assert (err, exit_.exit_code) == (b"", 0)


async def test_child_inherits_only_its_three_streams() -> None:
    out, _, _ = await run("ls /proc/self/fd", argv=["/bin/ls", "/proc/self/fd"])
    assert out.split() == [b"0", b"1", b"2", b"3"]  # 3: the directory ls is reading


async def test_child_is_in_a_new_session_of_its_own() -> None:
    execution = await Execution.start(spec("ps -o sid= -o pgid= -p $$"), NOBODY, 1 << 20)
    out, _, _ = await collect(execution)
    assert out.split() == [str(execution.pid).encode(), str(execution.pid).encode()]


async def test_child_yields_cpu_and_memory_to_the_agent() -> None:
    out, _, _ = await run("nice and OOM score", argv=["/bin/sh", "-c", "cat /proc/self/oom_score_adj; nice"])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert out.split() == [b"1000", str(min(base + spawner.TOOL_NICENESS, 19)).encode()]


async def test_old_path_still_switches_uid() -> None:
    out, _, exit_ = await run("id -u; id -G", identity=OLD_PATH)
    assert (out, exit_.exit_code) == (b"65534\n65534\n", 0)
    assert spawner._shared.get((65534, 65534)) is None  # the old path starts no helper


async def test_helper_runs_as_tool_user_and_is_not_dumpable() -> None:
    await run("true")
    pid = helper_pid()
    status = proc_status(pid)
    assert status["Uid"].split() == ["65534"] * 4
    assert status["Gid"].split() == ["65534"] * 4
    assert status["Groups"].strip() == ""
    assert status["TracerPid"] == "0"
    # Non-dumpable: its /proc entries are root's, so a tool process cannot read its memory or fds.
    assert os.stat(f"/proc/{pid}/mem").st_uid == 0
    out, err, exit_ = await run(f"cat /proc/{pid}/environ; ls /proc/{pid}/fd; head -c 1 /proc/{pid}/mem")
    assert out == b""
    assert err.count(b"Permission denied") == 3
    assert exit_.exit_code != 0


async def test_a_tool_process_can_kill_the_helper_and_the_next_spawn_restarts_it() -> None:
    await run("true")
    first = helper_pid()
    # The pause lets the reply arrive first: a helper killed before replying fails that one start.
    _, _, exit_ = await run(f"sleep 0.05; kill -9 {first}")
    assert (exit_.exit_code, exit_.signal) == (-1, 0)  # the helper died before it could reap the command
    out, _, exit_ = await run("id -u")
    assert (out, exit_.exit_code) == (b"65534\n", 0)
    second = helper_pid()
    assert second != first
    assert not exists(first)  # the dead helper was reaped


async def test_an_idle_helper_leaves_after_its_linger_and_the_next_spawn_starts_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spawner, "LINGER_S", 0.3)
    await run("true")
    first = helper_pid()
    deadline = time.monotonic() + 5
    while spawner.shared(65534, 65534).pid is not None:
        assert time.monotonic() < deadline, "the idle helper stayed"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # reaped by the agent's side
    assert not exists(first)
    out, _, exit_ = await run("id -u")
    assert (out, exit_.exit_code) == (b"65534\n", 0)
    assert helper_pid() != first


async def test_a_running_command_keeps_its_helper_past_the_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawner, "LINGER_S", 0.2)
    execution = await Execution.start(spec("sleep 0.8; exit 3"), NOBODY, 1 << 20)
    helper = helper_pid()
    await asyncio.sleep(0.5)
    assert spawner.shared(65534, 65534).pid == helper  # it alone can report the command's status
    _, _, exit_ = await collect(execution)
    assert (exit_.exit_code, exit_.signal) == (3, 0)
    # Idle from the command's end on: it leaves a linger later.
    await asyncio.sleep(0.6)
    assert spawner.shared(65534, 65534).pid is None


async def test_helper_killed_before_its_reply_fails_only_that_start() -> None:
    for _ in range(5):
        outcome: str | int
        try:
            _, _, exit_ = await run("kill -9 $PPID")  # the command's parent is the helper
            outcome = exit_.exit_code
        except SpawnError as exc:
            outcome = str(exc)
        assert outcome in ("the process spawner stopped", -1)
        out, _, _ = await run("echo next")
        assert out == b"next\n"


async def test_command_outliving_its_helper_ends_with_unknown_status_and_can_be_stopped() -> None:
    execution = await Execution.start(spec("sleep 0.3; exit 5"), NOBODY, 1 << 20)
    os.kill(helper_pid(), signal.SIGKILL)
    _, _, exit_ = await collect(execution)
    assert (exit_.exit_code, exit_.signal) == (-1, 0)
    stuck = await Execution.start(spec("sleep 100 & sleep 100"), NOBODY, 1 << 20)
    os.kill(helper_pid(), signal.SIGKILL)
    await asyncio.sleep(0.05)
    await stuck.stop(reason="stop")
    _, _, exit_ = await collect(stuck)
    assert exit_.aborted
    with pytest.raises(ProcessLookupError):
        os.killpg(stuck.pid, 0)


async def test_a_stopped_helper_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawner, "STATUS_TIMEOUT_S", 0.2)
    monkeypatch.setattr(spawner, "REPLY_TIMEOUT_S", 0.3)
    execution = await Execution.start(spec("sleep 0.1; exit 4"), NOBODY, 1 << 20)
    frozen = helper_pid()
    os.kill(frozen, signal.SIGSTOP)  # any tool process may do this: same uid
    _, _, exit_ = await collect(execution)
    assert exit_.exit_code == -1
    out, _, _ = await run("echo alive")
    assert out == b"alive\n"
    assert not exists(frozen)
    os.kill(helper_pid(), signal.SIGSTOP)
    with pytest.raises(SpawnError, match=r"^the process spawner stopped$"):
        await run("echo lost")
    out, _, _ = await run("echo alive again")
    assert out == b"alive again\n"


async def test_stop_kills_the_whole_group() -> None:
    execution = await Execution.start(spec("sleep 100 & sleep 100 & wait"), NOBODY, 1 << 20)
    await asyncio.sleep(0.1)
    await execution.stop(reason="user pressed stop")
    _, _, exit_ = await collect(execution)
    assert (exit_.aborted, exit_.abort_reason, exit_.signal) == (True, "user pressed stop", signal.SIGTERM)
    with pytest.raises(ProcessLookupError):
        os.killpg(execution.pid, 0)


async def test_sigterm_ignored_leads_to_sigkill() -> None:
    execution = await Execution.start(spec("trap '' TERM; sleep 100", kill_grace_s=0.1), NOBODY, 1 << 20)
    await asyncio.sleep(0.1)
    await execution.stop(reason="x")
    _, _, exit_ = await collect(execution)
    assert (exit_.signal, exit_.exit_code) == (9, 137)


async def test_signal_death_and_timeout_statuses() -> None:
    _, _, exit_ = await run("kill -9 $$")
    assert (exit_.exit_code, exit_.signal) == (137, 9)
    out, _, exit_ = await run("echo part; sleep 10", timeout_s=0.2)
    assert (out, exit_.timed_out, exit_.exit_code) == (b"part\n", True, 143)


async def test_background_holder_of_stdout_does_not_hang() -> None:
    started = time.monotonic()
    execution = await Execution.start(spec("sleep 5 & echo hi"), NOBODY, 1 << 20)
    out, _, exit_ = await collect(execution)
    assert (out, exit_.exit_code) == (b"hi\n", 0)
    assert time.monotonic() - started < 1
    await execution.stop(reason="cleanup")


async def test_stdin_merged_stderr_and_large_output() -> None:
    execution = await Execution.start(spec("cat; echo e >&2", stdin=True, merge_stderr=True), NOBODY, 1 << 20)
    await execution.write_stdin(b"ping\n")
    execution.close_stdin()
    out, err, _ = await collect(execution)
    assert (out, err) == (b"ping\ne\n", b"")
    out, _, exit_ = await collect(
        await Execution.start(spec("head -c 3000000 /dev/zero | tr '\\0' x"), NOBODY, 64 * 1024)
    )
    assert (out, exit_.exit_code) == (b"x" * 3_000_000, 0)


async def test_request_larger_than_one_frame() -> None:
    big = "y" * (spawner.FRAME + spawner.FRAME // 2)  # an argument may not exceed 128 KiB
    argv = ["/bin/sh", "-c", 'printf %s "$BIG" | wc -c; printf %s "$0" | wc -c', big]
    out, _, exit_ = await run("", env=ENV | {"BIG": big}, argv=argv)
    assert (out.split(), exit_.exit_code) == ([str(len(big)).encode()] * 2, 0)


async def test_spawn_errors_keep_their_texts(public_dir: Path) -> None:
    with pytest.raises(SpawnError, match=r"^cannot run '/no/such/program': no such file or directory$"):
        await Execution.start(spec("", argv=["/no/such/program"]), NOBODY, 1 << 20)
    script = public_dir / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(SpawnError, match=r"^cannot run '.*/script': permission denied$"):
        await Execution.start(spec("", argv=[str(script)]), NOBODY, 1 << 20)
    private = public_dir / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(SpawnError, match=r"^cannot run '/bin/sh': permission denied$"):
        await Execution.start(spec("true", cwd=str(private)), NOBODY, 1 << 20)
    with pytest.raises(SpawnError, match=r"^working directory /no/such/dir does not exist$"):
        await Execution.start(spec("true", cwd="/no/such/dir"), NOBODY, 1 << 20)
    out, _, _ = await run("echo still fine")
    assert out == b"still fine\n"


async def test_a_bare_name_is_searched_on_the_commands_own_path_as_execvp_does(public_dir: Path) -> None:
    first, second = public_dir / "first", public_dir / "second"
    first.mkdir(mode=0o755)
    second.mkdir(mode=0o755)
    (first / "tool").write_text("#!/bin/sh\necho first\n")
    (first / "tool").chmod(0o644)  # not executable: skipped, the next one on PATH runs
    (second / "tool").write_text("#!/bin/sh\necho second\n")
    (second / "tool").chmod(0o755)
    env = {"PATH": f"{public_dir / 'none'}:{first}:{second}:/usr/bin:/bin"}
    out, _, done = await collect(await Execution.start(spec("", argv=["tool"], env=env), NOBODY, 1 << 20))
    assert (out, done.exit_code) == (b"second\n", 0)
    (second / "tool").unlink()
    with pytest.raises(SpawnError, match=r"^cannot run 'tool': permission denied$"):
        await Execution.start(spec("", argv=["tool"], env=env), NOBODY, 1 << 20)
    with pytest.raises(SpawnError, match=r"^cannot run 'nowhere': no such file or directory$"):
        await Execution.start(spec("", argv=["nowhere"], env=env), NOBODY, 1 << 20)
    with pytest.raises(SpawnError, match=r"^cannot run 'true': no such file or directory$"):
        await Execution.start(spec("", argv=["true"], env={"PATH": ""}), NOBODY, 1 << 20)


async def test_many_quick_spawns_leave_no_zombie_and_no_fd() -> None:
    await run("true")
    fds = open_fds()
    pid = helper_pid()
    for _ in range(200):
        _, _, exit_ = await run("exit 7")
        assert exit_.exit_code == 7
    results = await asyncio.gather(*(run(f"echo {i}") for i in range(30)))
    assert [out for out, _, _ in results] == [f"{i}\n".encode() for i in range(30)]
    assert helper_pid() == pid
    assert children_of(pid) == []
    assert open_fds() - fds == set()
    helper_fds = len(os.listdir(f"/proc/{pid}/fd"))
    assert helper_fds <= 5  # stdin, stdout, stderr, the socket, the epoll fd


async def test_cancelled_start_leaves_no_process() -> None:
    await run("true")
    task = asyncio.ensure_future(Execution.start(spec("sleep 100.25"), NOBODY, 1 << 20))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert children_of(helper_pid()) == []


async def test_close_stops_the_helper_and_running_commands_survive() -> None:
    execution = await Execution.start(spec("sleep 0.2; echo done"), NOBODY, 1 << 20)
    pid = helper_pid()
    await Execution.close_spawners()
    assert not exists(pid)
    out, _, exit_ = await collect(execution)
    assert (out, exit_.exit_code) == (b"done\n", -1)
    out, _, _ = await run("echo again")  # a new helper for the next spawn
    assert out == b"again\n"


async def test_helper_exits_when_the_agent_side_closes_without_a_loop() -> None:
    await run("true")
    helper = spawner.shared(65534, 65534)
    pid = helper_pid()
    helper.close()  # the path used when an old event loop is gone
    assert not exists(pid)


def test_helper_interpreter_is_reachable() -> None:
    assert HOST_PYTHON is not None
    assert os.stat(HOST_PYTHON).st_mode & stat.S_IXOTH


@pytest.mark.parametrize("identity", [NOBODY, OLD_PATH], ids=["spawner", "popen"])
async def test_a_tool_user_reopens_its_own_stdio(identity: Identity) -> None:
    """`> /dev/stdout`, `tee /dev/stderr` and `/dev/fd/1` reopen the process's pipes through /proc/self/fd, which
    needs the pipe's own permission: the agent's pipes (root, 0600) refused the tool user (EACCES)."""
    out, err, exit_ = await run("echo A > /dev/stdout; echo B | tee /dev/stderr > /dev/null; echo C > /dev/fd/1",
                                identity)
    assert (out, err, exit_.exit_code) == (b"A\nC\n", b"B\n", 0)
