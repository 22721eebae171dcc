"""The OCI runtimes the security suite runs on: runc always, gVisor's runsc where this machine runs it.

`scripts/ensure-engine.sh` (through ensure-runsc.sh) installs Debian's runsc and registers it with dockerd;
where that was not possible, or a gVisor container does not start here (no ptrace platform, an old kernel),
the gVisor runs skip with the reason found.
"""

from __future__ import annotations

import functools
import os
import subprocess

import pytest

RUNTIMES = ["runc", "runsc"]
IMAGE = os.environ.get("OCSB_TEST_IMAGE", "ocsb-sandbox:latest")


@functools.cache
def runsc_missing() -> str | None:
    """Why gVisor cannot be tested on this machine, or None when a container of the image runs on it."""
    try:
        runtimes = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True,
                                  text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    if '"runsc"' not in runtimes:
        return "dockerd has no runsc runtime (scripts/ensure-runsc.sh could not install or register it)"
    try:
        probe = subprocess.run(
            ["docker", "run", "--rm", "--runtime", "runsc", "--network", "none", "--entrypoint", "true", IMAGE],
            capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return "a gVisor container did not finish `true` within 60 s on this machine"
    if probe.returncode != 0:
        return f"a gVisor container does not run here: {probe.stderr.strip()[-300:]}"
    return None


def skip_unless_usable(runtime: str) -> None:
    if runtime == "runsc" and (reason := runsc_missing()) is not None:
        pytest.skip(f"gVisor: {reason}")


def gvisor_gap(request: pytest.FixtureRequest, runtime: str, reason: str) -> None:
    """A property runc holds and gVisor does not (yet): a strict xfail on gVisor, so a fix is noticed."""
    if runtime == "runsc":
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """The OCI runtime a module runs on: runc, then gVisor's runsc where it runs here (a module imports it)."""
    chosen: str = request.param
    skip_unless_usable(chosen)
    return chosen
