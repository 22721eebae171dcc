"""A real ToolContext over a temporary project directory, with scripted permission answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.tools.base import SessionState, ToolContext, ToolError
from sandbox_agent.tools.runner import ToolRunner


@dataclass
class Asked:
    permission: str
    patterns: list[str]
    always: list[str]
    metadata: dict[str, Any]
    checks: list[str] = field(default_factory=list, compare=False)
    """Normalised forms the rules also saw (bash only); left out of comparisons, which are upstream's fields."""
    opaque: bool = field(default=False, compare=False)


@dataclass
class Recorder:
    """Records every ask and metadata update; `deny` names permissions that fail."""

    asks: list[Asked] = field(default_factory=list)
    updates: list[tuple[str | None, dict[str, Any] | None]] = field(default_factory=list)
    deny: set[str] = field(default_factory=set)

    async def ask(self, permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any],
                  checks: Sequence[str] = (), opaque: bool = False) -> None:
        self.asks.append(Asked(permission, list(patterns), list(always), dict(metadata), list(checks), opaque))
        if permission in self.deny:
            raise ToolError("The user rejected permission to use this specific tool call.")

    async def metadata(self, title: str | None, metadata: dict[str, Any] | None) -> None:
        self.updates.append((title, metadata))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the project, with a file and a subdirectory: what a command may reach outside it."""
    root = tmp_path / "outside"
    (root / "dir").mkdir(parents=True)
    (root / "file.txt").write_text("x")
    return root


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_ctx(project: Path, runner: ToolRunner, recorder: Recorder) -> Callable[..., ToolContext]:
    """make_ctx(worktree=..., state=...) -> a context rooted at `project`; calls share one session state."""
    shared = SessionState()

    def make(*, worktree: str = "/", state: SessionState | None = None, **extra: Any) -> ToolContext:
        return ToolContext(
            session_id="ses_test", message_id="msg_test", call_id="call_test", agent="build",
            directory=str(project), worktree=worktree, ask=recorder.ask, metadata=recorder.metadata,
            runner=runner, state=state or shared, abort=asyncio.Event(), extra=extra,
        )

    return make
