"""A real sandbox agent (in-process, LocalSandboxProvider) for the MCP tests."""

from __future__ import annotations

import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.core.seam.provider import Sandbox
from controlplane.core.sessions.models import Resources
from controlplane.sandbox.local import LocalSandboxProvider
from controlplane.store.sqlite import SqliteStore
from tests.planes import short_tmp

SERVER = str(Path(__file__).with_name("stdio_server.py"))


def server_command(mode: str = "ok") -> list[str]:
    return [sys.executable, SERVER, mode]


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    data_dir = short_tmp()
    store = SqliteStore(data_dir / "db.sqlite")
    provider = LocalSandboxProvider(data_dir, "mcp-test", store)
    try:
        yield await provider.acquire("ses_mcp", "tenant", Resources(1.0, 512, 128))
    finally:
        await provider.close()
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
