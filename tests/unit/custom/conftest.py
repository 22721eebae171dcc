"""Real tool hosts for the tests: real Bun with the staged @opencode-ai/plugin and zod, and this Python,
both started through `local_runner()` as the current user."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.custom.host import HostResult, ToolHost, bun_launcher, python_launcher
from sandbox_agent.tools.base import ToolError
from sandbox_agent.tools.runner import ToolRunner

REPO = Path(__file__).resolve().parents[3]
TOOLHOST_DIR = REPO / "sandbox-image" / "toolhost"
PYHOST = REPO / "sandbox-image" / "pyhost" / "host.py"
REQUIRED_MODULES = ("@opencode-ai/plugin", "zod")


def find_bun() -> Path:
    cached = sorted(Path(p) for p in glob.glob(str(REPO / "build/cache/bun-*/package/bin/bun")))
    candidates = [REPO / "build" / "image" / "bun", *cached]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (run `make image`)")


def find_node_modules() -> Path:
    candidates = [REPO / "build" / "image" / "node_modules",
                  *sorted(Path(p) for p in glob.glob(str(REPO / "build/cache/node-*/node_modules")))]
    for candidate in candidates:
        if all((candidate / module / "package.json").is_file() for module in REQUIRED_MODULES):
            return candidate
    pytest.fail("no staged node_modules with @opencode-ai/plugin and zod: expected build/image/node_modules "
                "(run `make image`)")


@dataclass
class Recorder:
    """The driver's callbacks: records metadata updates and asks; `deny` maps a permission to a refusal."""

    updates: list[tuple[str | None, dict[str, Any] | None]] = field(default_factory=list)
    asks: list[tuple[str, list[str], list[str], dict[str, Any]]] = field(default_factory=list)
    deny: dict[str, str] = field(default_factory=dict)

    async def on_metadata(self, title: str | None, metadata: dict[str, Any] | None) -> None:
        self.updates.append((title, metadata))

    async def on_ask(self, permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any]) -> None:
        self.asks.append((permission, patterns, always, metadata))
        if permission in self.deny:
            raise ToolError(self.deny[permission])


@dataclass
class Sandbox:
    """A fake sandbox root: node_modules at its top (like /node_modules), the host, a project."""

    root: Path
    project: Path
    tools: Path
    plugins: Path
    recorder: Recorder

    def write(self, relative: str, source: str) -> str:
        path = self.project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip())
        return str(path)

    def tool(self, name: str, source: str) -> str:
        return self.write(f".opencode/tool/{name}", source)

    def context(self, **extra: Any) -> dict[str, Any]:
        return {"sessionID": "ses_1", "messageID": "msg_1", "agent": "build", "callID": "call_1",
                "directory": str(self.project), "worktree": str(self.project), "extra": extra}

    async def call(self, host: ToolHost, tool: str, args: dict[str, Any], *, abort: asyncio.Event | None = None,
                   timeout_s: float | None = 20.0) -> HostResult:
        return await host.call(tool, args, self.context(), on_metadata=self.recorder.on_metadata,
                               on_ask=self.recorder.on_ask, abort=abort or asyncio.Event(), timeout_s=timeout_s)


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    (tmp_path / "node_modules").symlink_to(find_node_modules())
    shutil.copytree(TOOLHOST_DIR, tmp_path / "opt" / "toolhost")
    (tmp_path / "home").mkdir()
    project = tmp_path / "project"
    (project / ".opencode" / "tool").mkdir(parents=True)
    (project / ".opencode" / "plugin").mkdir(parents=True)
    return Sandbox(tmp_path, project, project / ".opencode" / "tool", project / ".opencode" / "plugin", Recorder())


@pytest.fixture
async def bun_host(sandbox: Sandbox, runner: ToolRunner) -> AsyncIterator[ToolHost]:
    env = {"HOME": str(sandbox.root / "home")}
    host_ts = sandbox.root / "opt" / "toolhost" / "host.ts"
    host = ToolHost(bun_launcher(runner, str(find_bun()), str(host_ts), str(sandbox.project), env), "bun")
    yield host
    await host.close()


@pytest.fixture
async def py_host(sandbox: Sandbox, runner: ToolRunner) -> AsyncIterator[ToolHost]:
    env = {"HOME": str(sandbox.root / "home")}
    host = ToolHost(python_launcher(runner, sys.executable, str(PYHOST), str(sandbox.project), env), "python")
    yield host
    await host.close()


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Polls `condition` (a file a tool writes, a process that ends) until it holds."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail("the condition did not hold in time")


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False

