"""The recorded webfetch cases (tests/oracle/cases_web.py) replayed through the public gRPC API: the control plane
fetches, so each case's server runs on the host (its setup, in a scratch directory) and the plane's egress
policy admits loopback. The answers must be upstream OpenCode v1.2.27's, exactly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.oracle.cases import HOME, Recorded, cases, load
from tests.oracle.compare import expected, ours
from tests.oracle.record import prepare
from tests.planes import Plane, served_plane

RECORDED = load("web")
LOCAL_HOME = re.compile(r"/tmp/ocsb[^/\"]+/sandboxes/[0-9a-f]+/home")


loopback_plane = served_plane("local", name="loopback_plane", egress={"allow_cidrs": ["127.0.0.0/8"]})


@pytest.mark.parametrize("recorded", RECORDED, ids=[r.case.name for r in RECORDED])
async def test_same_answer_as_upstream(loopback_plane: Plane, recorded: Recorded) -> None:
    case = recorded.case
    with tempfile.TemporaryDirectory(prefix="ocsb-web-") as scratch:
        prepare(case, Path(scratch) / "workspace")  # writes server.py and starts it (it exits by itself)
        client = loopback_plane.client
        session = await client.create_session(config_json=json.dumps(case.config) if case.config else "")
        try:
            outcome = await client.execute_tool(session.id, case.tool, case.params, agent=case.agent)
            assert ours(outcome, lambda text: LOCAL_HOME.sub(HOME, text)) == expected(recorded)
        finally:
            await client.delete_session(session.id)
            _stop_server(Path(scratch) / "workspace" / "server.pid")


def _stop_server(pid_file: Path) -> None:
    """The case's own server (it would exit by itself a little later)."""
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def test_every_case_was_recorded() -> None:
    assert {c.name for c in cases("web")} == {r.case.name for r in RECORDED}, "run: python -m tests.oracle.record web"
    assert subprocess.run(["python3", "--version"], capture_output=True).returncode == 0
