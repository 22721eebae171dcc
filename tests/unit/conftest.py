"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_agent.tools.runner import ToolRunner, local_runner
from tests.unit.tools.web_support import Guard, install_guard


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Guard:
    """The egress guard for tests that talk to loopback servers: the loop's connections and lookups are
    recorded, and anything outside loopback fails instead of leaving the host. Its name keeps the test on
    asyncio's loop (tests/conftest.py), whose methods it patches."""
    return install_guard(monkeypatch)


@pytest.fixture
def runner() -> Iterator[ToolRunner]:
    """The agent's tool runner as the current user (the tools' and the tool hosts' tests)."""
    r = local_runner()
    yield r
    r.close()
