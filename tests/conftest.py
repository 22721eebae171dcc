from __future__ import annotations

import os

# gRPC's fork handlers run in every child forked from this (gRPC-heavy) process and can crash it
# before its exec (the spawner helper starts with Popen(user=...), a real fork). Every child here
# execs at once, so they are not needed; the sandbox image sets the same.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import pytest

from sandbox_agent import event_loop
from tests.planes import Plane, environment, served_plane, short_tmp

if TYPE_CHECKING:
    from scripts.trace_demo_receiver import Rotel

# One Docker-backed control plane shared by the Docker tests (pool of 2).
docker_plane = served_plane("docker", name="docker_plane", scope="session", pool={"size": 2, "refill_concurrency": 2})


# The registry reads OPENCODE_EXPERIMENTAL_LSP_TOOL when the control plane starts.
lsp_flag = environment("lsp_flag", {"OPENCODE_EXPERIMENTAL_LSP_TOOL": "1"})


# A Docker plane of its own that offers the `lsp` tool (one per module: the flag is read at start).
lsp_plane = served_plane("docker", name="lsp_plane", needs=("lsp_flag",), pool={"size": 1, "refill_concurrency": 1})


# A control plane whose sandboxes are in-process agents (fast, no isolation).
local_plane = served_plane("local", name="local_plane", scope="session")


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def either_plane(request: pytest.FixtureRequest) -> Plane:
    """The in-process plane, then the shared Docker one: for behaviour that must not depend on where the
    sandbox runs."""
    found: Plane = request.getfixturevalue("docker_plane" if request.param == "docker" else "local_plane")
    return found



@pytest.fixture
async def rotel() -> AsyncIterator[Rotel]:
    """A real OpenTelemetry collector (rotel) on loopback, writing what it receives to a debug log."""
    from scripts.trace_demo_receiver import Rotel

    receiver = Rotel(short_tmp() / "rotel.log")
    await asyncio.to_thread(receiver.start)
    try:
        yield receiver
    finally:
        await asyncio.to_thread(receiver.stop)
        shutil.rmtree(receiver.log_path.parent, ignore_errors=True)

def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item,
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The tests run on the loop `controlplane serve` and the agent run on (uvloop's, where installed).

    Tests that fence the network in (the egress guard patches asyncio's loop, which uvloop's does not
    share) stay on asyncio's loop.
    """
    factory = event_loop.loop_factory()
    if factory is None or "guard" in getattr(item, "fixturenames", ()):
        return {"asyncio": asyncio.new_event_loop}
    return {"uvloop": factory}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Sandbox dirs left mounted by a data dir a test deleted (its rmtree emptied them and could not remove
    them): only orphans, so another run's live planes are not touched."""
    import glob
    from pathlib import Path

    from controlplane.sandbox import dir_mounts

    for point in glob.glob("/tmp/ocsb*/sandboxes/*"):
        if os.path.ismount(point) and not os.path.exists(os.path.join(point, "labels.json")):
            with contextlib.suppress(OSError):
                dir_mounts.unmount(Path(point))
