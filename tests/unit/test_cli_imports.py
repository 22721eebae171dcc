"""Client commands import only what they need: `--help` and `session list` load no server, Docker,
OpenTelemetry SDK, gRPC health, MCP or pydantic-settings module (what made every quickstart line take two
seconds). Checked on the real command's `-X importtime` record; the wall time is `make bench`'s."""

from __future__ import annotations

import asyncio
import os
import sys

from controlplane.cli_common import DEFAULT_DATA_DIR, DEFAULT_LISTEN, place
from controlplane.config import Settings
from tests.planes import Plane

# grpc's own __init__ imports the empty top-level `grpc_health` package (0.1 ms); the health service is `.v1`.
HEAVY = ("controlplane.app", "controlplane.core.calls", "controlplane.rpc", "controlplane.sandbox",
         "controlplane.store", "controlplane.config", "docker", "opentelemetry.sdk", "grpc_health.v1", "mcp",
         "pydantic_settings", "uvicorn", "starlette")


async def imported(argv: list[str], env: dict[str, str]) -> set[str]:
    # A subprocess of the event loop's own: the plane it talks to serves on this loop.
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-m", "controlplane", *argv, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0, err[-2000:]
    lines = err.decode().splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def client_env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    return {**clean, **extra}


async def test_help_imports_nothing_heavy() -> None:
    assert heavy(await imported(["--help"], client_env())) == []


async def test_session_list_imports_nothing_heavy(local_plane: Plane) -> None:
    env = client_env(CONTROLPLANE_TARGET=local_plane.plane.address, CONTROLPLANE_TOKEN=local_plane.token)
    modules = await imported(["session", "list"], env)
    assert "grpc" in modules  # it did talk to the plane
    assert heavy(modules) == []


def test_the_fast_defaults_are_the_settings_defaults() -> None:
    settings = Settings()
    assert place(None).data_dir == settings.data_dir
    assert DEFAULT_LISTEN == settings.server.listen
    assert str(settings.data_dir).endswith(DEFAULT_DATA_DIR.removeprefix("~"))
    assert place(None).token_file == settings.token_file
    assert place(None).admin_token_file == settings.admin_token_file
