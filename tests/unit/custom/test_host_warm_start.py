"""Which tool hosts a session runs, and when: the hosts its code snapshot needs start as the snapshot is taken
(so a session's first listing does not wait for them), and no host starts without files to load.

Real hosts started by the real manager as the current user; what runs is read from /proc (each host's command
line and working directory, the test's project), not from the manager's own state, and what the manager asked
to start from the real runner's `start_server` (recorded on the way through: a host that dies at once, as a
Bun host without the image's files does here, still counts as started).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.custom.manager import CustomTools
from sandbox_agent.tools.runner import ToolRunner
from tests.unit.custom.conftest import find_bun

PY_TOOL = '''from opencode_tool import tool

default = tool(description="warm", args={"type": "object", "properties": {}}, execute=lambda args, ctx: "ok")
'''
HOST_MARKERS = {"python": "pyhost/host.py", "bun": "toolhost/host.ts"}


def hosts_in(project: Path) -> dict[str, list[int]]:
    """pids of the Python and Bun tool hosts whose working directory is `project`, by kind."""
    found: dict[str, list[int]] = {kind: [] for kind in HOST_MARKERS}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if cwd != str(project):
            continue
        for kind, marker in HOST_MARKERS.items():
            if any(arg.endswith(marker) for arg in argv):
                found[kind].append(int(entry))
    return found


async def wait_for_host(project: Path, kind: str, timeout_s: float = 20.0) -> list[int]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (pids := hosts_in(project)[kind]):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {kind} tool host started for {project} within {timeout_s:g} s")
        await asyncio.sleep(0.02)
    return pids


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / ".opencode" / "tool").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    (tmp_path / "code").mkdir()
    return project


@pytest.fixture
def launched(runner: ToolRunner, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The argv of every server the manager starts through `runner`, which still starts each of them."""
    argvs: list[list[str]] = []
    start_server = runner.start_server

    async def recording(argv: list[str], **kwargs: Any) -> Any:
        argvs.append(list(argv))
        return await start_server(argv, **kwargs)

    monkeypatch.setattr(runner, "start_server", recording)
    return argvs


@pytest.fixture
async def custom(runner: ToolRunner, project: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CustomTools]:
    monkeypatch.setenv("AGENT_BUN", str(find_bun()))  # Bun is there: whether its host runs is the manager's choice
    tools = CustomTools(runner, str(project), str(project.parent / "home"), code_dir=str(project.parent / "code"))
    yield tools
    await tools.close()


async def test_the_python_host_starts_with_the_snapshot_and_the_first_listing_uses_it(
    custom: CustomTools, project: Path,
) -> None:
    (project / ".opencode" / "tool" / "warm.py").write_text(PY_TOOL)
    await custom.take_snapshot({}, {}, str(project))
    started = await wait_for_host(project, "python")  # before anything was listed
    assert len(started) == 1, started

    listing = await custom.listing({}, {}, str(project))
    assert [t.id for t in listing.tools] == ["warm"], listing
    assert hosts_in(project)["python"] == started  # the same process: the listing started no other


def hosts_launched(argvs: list[list[str]]) -> list[str]:
    return [kind for argv in argvs for kind, marker in HOST_MARKERS.items() if any(a.endswith(marker) for a in argv)]


async def test_a_python_only_session_runs_no_bun_host(
    custom: CustomTools, project: Path, launched: list[list[str]],
) -> None:
    (project / ".opencode" / "tool" / "warm.py").write_text(PY_TOOL)
    await custom.take_snapshot({}, {}, str(project))
    listing = await custom.listing({}, {}, str(project))
    assert [t.id for t in listing.tools] == ["warm"], listing
    await custom.listing({}, {}, str(project))
    assert hosts_launched(launched) == ["python"]


async def test_a_session_without_tool_files_starts_no_host(
    custom: CustomTools, project: Path, launched: list[list[str]],
) -> None:
    await custom.take_snapshot({}, {}, str(project))
    listing = await custom.listing({}, {}, str(project))
    assert listing.tools == []
    assert listing.load_errors == []
    await asyncio.sleep(0.2)  # a host started in the background would have been asked for by now
    assert launched == []
    assert hosts_in(project) == {"python": [], "bun": []}


async def test_closing_while_a_host_starts_leaves_none_running(custom: CustomTools, project: Path) -> None:
    (project / ".opencode" / "tool" / "warm.py").write_text(PY_TOOL)
    await custom.take_snapshot({}, {}, str(project))
    await custom.close()  # at once: the host is still starting
    await asyncio.sleep(0.3)
    assert hosts_in(project)["python"] == []


async def test_a_reload_stops_the_old_host_and_starts_a_new_one(custom: CustomTools, project: Path) -> None:
    tool_file = project / ".opencode" / "tool" / "warm.py"
    tool_file.write_text(PY_TOOL)
    await custom.take_snapshot({}, {}, str(project))
    first = await wait_for_host(project, "python")
    tool_file.write_text(PY_TOOL.replace('"warm"', '"warmer"'))
    await custom.take_snapshot({}, {}, str(project))
    deadline = asyncio.get_running_loop().time() + 20
    while (now := hosts_in(project)["python"]) in ([], first):
        assert asyncio.get_running_loop().time() < deadline, now
        await asyncio.sleep(0.02)
    assert set(now).isdisjoint(first)
    listing = await custom.listing({}, {}, str(project))
    assert [t.description for t in listing.tools] == ["warmer"]
