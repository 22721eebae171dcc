"""The Docker engine that `make run` or a test run starts lives in a session of its own (scripts/detached.sh,
used by scripts/ensure-engine.sh): a SIGTERM to the starting command's process group, as a supervisor or
`timeout` sends, does not reach it. Checked with a real process started the way dockerd is."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_a_signal_to_the_starting_group_does_not_reach_the_engine() -> None:
    # `make run`, as a supervisor runs it: a process group of its own, which starts the "engine" and serves on.
    starter = subprocess.Popen(
        ["bash", "-c", f"bash {ROOT}/scripts/detached.sh sleep 300; exec sleep 300"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    assert starter.stderr is not None
    line = starter.stderr.readline()
    found = re.search(r"as pid (\d+)", line)
    assert found, line
    engine = int(found.group(1))
    try:
        deadline = time.monotonic() + 5
        while os.getsid(engine) != engine and time.monotonic() < deadline:
            time.sleep(0.02)  # the pid is said right after the fork, before the child's setsid()
        assert os.getsid(engine) == engine != os.getsid(starter.pid)
        os.killpg(starter.pid, signal.SIGTERM)
        assert starter.wait(10) == -signal.SIGTERM
        time.sleep(0.2)
        assert alive(engine), "the engine went down with the command that started it"
    finally:
        if alive(engine):
            os.kill(engine, signal.SIGKILL)
        if starter.poll() is None:
            os.killpg(starter.pid, signal.SIGKILL)
            starter.wait()
        starter.stderr.close()


def test_ensure_engine_starts_dockerd_detached() -> None:
    script = (ROOT / "scripts/ensure-engine.sh").read_text()
    assert re.search(r'^\s*bash "\$here/detached\.sh" dockerd ', script, re.MULTILINE)
    assert not re.search(r"^\s*(nohup\s+)?dockerd\b", script, re.MULTILINE), "a dockerd started in the caller's group"
