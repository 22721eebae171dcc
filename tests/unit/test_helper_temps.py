"""A writing helper killed mid-entry leaves no temporary file: the agent removes the one it announced.

The helpers run here as real processes (`python -m sandbox_agent.tario` / `fileops`), SIGKILLed while they wait
for the rest of an entry, as the agent's SIGKILL at the end of a grace period (or a tool process of the same
uid) would do; tests/docker/test_file_upload_races.py does the same through the public API.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sandbox_agent import fileops, helper_temps
from sandbox_agent.fileops import FileRefusedError
from sandbox_agent.helper_temps import Announced, remove_temp
from sandbox_agent.process import ExecSpec, Execution, Exit, Identity

AGENT_ROOT = str(Path(__file__).resolve().parents[2] / "sandbox-image")


def _tar(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _killed_mid_entry(argv: list[str], partial: bytes, dest: Path) -> bytes:
    """Starts the helper, feeds it `partial`, waits for its temporary entry to appear, SIGKILLs it."""
    env = {**os.environ, "PYTHONPATH": AGENT_ROOT}
    helper = subprocess.Popen([sys.executable, "-m", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env)
    assert helper.stdin is not None
    assert helper.stdout is not None
    helper.stdin.write(partial)
    helper.stdin.flush()
    deadline = time.monotonic() + 20
    while not any(".ocsb" in name for name in os.listdir(dest)):
        assert time.monotonic() < deadline, "the helper never made its temporary entry"
        time.sleep(0.02)
    helper.send_signal(signal.SIGKILL)
    helper.wait()
    out = helper.stdout.read()
    helper.stdin.close()
    helper.stdout.close()
    return out


def _remover(ws: Path, announced: Announced) -> int:
    """What the agent runs (as the tool user) for the last announced temporary entry; its exit status."""
    assert announced.temp is not None
    env = {**os.environ, "PYTHONPATH": AGENT_ROOT}
    argv = [sys.executable, "-m", "sandbox_agent.helper_temps", "remove", str(ws), announced.temp]
    return subprocess.run(argv, env=env, check=False).returncode


def test_an_upload_killed_mid_member_leaves_only_the_old_file(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "dir").mkdir(parents=True)
    (ws / "dir" / "only.txt").write_bytes(b"OLD\n")
    partial = _tar("only.txt", b"N" * 300_000)[:64 * 1024]
    out = _killed_mid_entry(["sandbox_agent.tario", "extract", str(ws / "dir"), "100000000", str(ws)], partial,
                            ws / "dir")
    assert len(os.listdir(ws / "dir")) == 2  # the killed helper's temporary entry is there
    announced = Announced(str(ws))
    for i in range(0, len(out), 7):  # in pieces, as a pipe delivers them
        announced.feed(out[i:i + 7])
    assert _remover(ws, announced) == 0
    assert os.listdir(ws / "dir") == ["only.txt"]
    assert (ws / "dir" / "only.txt").read_bytes() == b"OLD\n"


def test_a_write_killed_mid_content_leaves_only_the_old_file(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_bytes(b"OLD\n")
    first = len(b"x" * 1000).to_bytes(4, "big") + b"x" * 1000  # one frame, no end mark: the helper waits
    out = _killed_mid_entry(["sandbox_agent.fileops", "write", str(ws), "a.txt", "-", "0", "1000000"], first, ws)
    announced = Announced(str(ws))
    announced.feed(out)
    assert _remover(ws, announced) == 0
    assert os.listdir(ws) == ["a.txt"]
    assert (ws / "a.txt").read_bytes() == b"OLD\n"


def test_the_result_is_what_is_left_of_stdout() -> None:
    announced = Announced("/workspace")
    announced.feed(b'@"/workspace/.ocsb-upload-1-1"\n@"/workspace/d/.ocsb-upl')
    announced.feed(b'oad-1-2"\n{"files": 2, "text": "a\\nb"}')
    assert announced.temp == "/workspace/d/.ocsb-upload-1-2"
    assert announced.result() == b'{"files": 2, "text": "a\\nb"}'


@pytest.mark.parametrize("name", ["keep.txt", ".ocsb-upload-1", "ocsb-upload-1-2", ".x.ocsb-", "..", "."])
def test_only_a_helpers_temporary_names_are_removed(tmp_path: Path, name: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / name
    if name not in ("..", "."):
        target.write_bytes(b"user's")
    assert not remove_temp(str(ws), os.path.join(str(ws), name))
    if name not in ("..", "."):
        assert target.read_bytes() == b"user's"


def test_a_removal_never_follows_a_link_or_leaves_the_workspace(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    victim = outside / ".ocsb-upload-1-1"
    victim.write_bytes(b"not the workspace's")
    os.symlink(outside, ws / "link")  # a tool process swapped a directory for a link
    assert not remove_temp(str(ws), str(ws / "link" / ".ocsb-upload-1-1"))
    assert not remove_temp(str(ws), str(victim))
    assert not remove_temp(str(ws), str(ws / "d" / ".." / ".." / "outside" / ".ocsb-upload-1-1"))
    assert victim.exists()


def test_a_taken_temporary_name_is_never_announced_for_removal(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # A tool process can guess the helper's next temporary name and make it first: the write is refused
    # (EEXIST), and that entry, which the helper did not make, must not be removed for it.
    ws = tmp_path / "ws"
    ws.mkdir()
    taken = ws / f".a.txt.ocsb-{os.getpid()}"
    taken.write_bytes(b"a tool's own file")
    with pytest.raises(FileRefusedError):
        fileops.write(str(ws), "a.txt", None, False, 1000, io.BytesIO(fileops.frame(b"new") + fileops.frame(b"")))
    announced = Announced(str(ws))
    announced.feed(capsys.readouterr().out.encode())
    assert announced.temp is None
    assert taken.read_bytes() == b"a tool's own file"


async def test_a_stuck_remover_is_stopped_when_its_time_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # The remover runs as the tool user, who can SIGSTOP it: its caller does not wait past the bound, and the
    # process is stopped, not left behind.
    monkeypatch.setattr(helper_temps, "REMOVER_TIMEOUT_S", 0.5)
    started: list[Execution] = []

    async def start(argv: list[str], stdin: bool) -> Execution:
        spec = ExecSpec(argv=["sh", "-c", "kill -STOP $$"], env=dict(os.environ), cwd="/", timeout_s=None,
                        stdin=False, kill_grace_s=0.2, merge_stderr=False)
        started.append(await Execution.start(spec, Identity(None, None), 1 << 20))
        return started[0]

    announced = Announced("/workspace")
    announced.feed(b'@"/workspace/.ocsb-upload-1-1"\n')
    await asyncio.wait_for(announced.remove_left(start), 10)
    exit_ = [item async for item in started[0].events()][-1]
    assert isinstance(exit_, Exit)
    assert exit_.aborted
