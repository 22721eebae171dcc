"""The agent refuses to start where its working directory would come first on sys.path (no PYTHONSAFEPATH, no -P):
it runs as root in the workspace, which the model writes (tests/docker/test_agent_import_path.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AGENT_ROOT = Path(__file__).resolve().parents[2] / "sandbox-image"
REFUSAL = "its working directory would come first on sys.path"


def stderr_of_start(tmp_path: Path, **env: str) -> tuple[int | None, str]:
    """What the agent says on stderr within a few seconds of its start here, and its exit status (None: it ran on
    and was stopped; with no sandbox around, it stops on its own further on or waits)."""
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(AGENT_ROOT), **env}
    process = subprocess.Popen([sys.executable, "-m", "sandbox_agent"], cwd=tmp_path, env=clean,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = process.communicate(timeout=5)
        return process.returncode, stderr
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        return None, stderr


def test_an_agent_started_with_its_working_directory_on_the_path_refuses(tmp_path: Path) -> None:
    status, stderr = stderr_of_start(tmp_path)
    assert status == 1
    assert REFUSAL in stderr


def test_with_a_safe_path_it_goes_past_that_check(tmp_path: Path) -> None:
    _, stderr = stderr_of_start(tmp_path, PYTHONSAFEPATH="1")
    assert REFUSAL not in stderr
