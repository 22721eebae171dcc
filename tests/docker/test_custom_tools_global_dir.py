"""The operator's global tools dir end to end with real sandboxes: mounted read-only into pooled sandboxes,
project tools winning over global ones, a missing dir refused at start and a writable mount failing hardening."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from controlplane import app
from controlplane.client import AsyncClient, allow_once
from controlplane.config import load_settings
from controlplane.core.sessions.models import Resources
from controlplane.errors import ConfigError, HardeningError
from controlplane.sandbox import code_mount
from controlplane.sandbox.docker import verify_hardening
from controlplane.sandbox.layout import GLOBAL_DIR
from tests.archives import tar_of
from tests.docker.custom_tools_support import ECHO_TS, custom_tools
from tests.planes import Plane, new_instance, remove_data_dir, remove_instance_leftovers, short_tmp

pytestmark = pytest.mark.docker


# -- the operator's global tools dir -------------------------------------------------------------

GLOBAL_TOOL_TS = """import { tool } from "@opencode-ai/plugin"
import { writeFileSync } from "node:fs"

export default tool({
  description: "From the operator",
  args: {},
  async execute(_args, ctx) { return `global tool in ${ctx.directory}` },
})

export const vandal = tool({
  description: "Tries to write into its own directory",
  args: {},
  async execute() {
    try {
      writeFileSync("/opt/opencode/global/tool/planted.ts", "export default 1")
      return "wrote it"
    } catch (error) {
      return `refused: ${(error as { code?: string }).code}`
    }
  },
})
"""
SHARED_GLOBAL_TS = """import { tool } from "@opencode-ai/plugin"
export default tool({ description: "shared (global)", args: {}, async execute() { return "global wins" } })
"""
SHARED_PROJECT_TS = """import { tool } from "@opencode-ai/plugin"
export default tool({ description: "shared (project)", args: {}, async execute() { return "project wins" } })
"""


def make_global_dir() -> Path:
    root = short_tmp()
    (root / "tool").mkdir()
    (root / "tool" / "operator.ts").write_text(GLOBAL_TOOL_TS)
    (root / "tool" / "shared.ts").write_text(SHARED_GLOBAL_TS)
    # The sandbox's tool user (uid 1000) reads it; mkdtemp made it private to us.
    for path in [root, root / "tool", *(root / "tool").iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@asynccontextmanager
async def plane_with_global_dir(global_dir: Path) -> AsyncIterator[Plane]:
    data_dir = short_tmp()
    instance = new_instance("g")
    settings = load_settings(
        None, data_dir=data_dir, instance=instance, server={"listen": "127.0.0.1:0"},
        provider={"type": "docker", "global_dir": str(global_dir),
                  **({"image": os.environ["OCSB_TEST_IMAGE"]} if os.environ.get("OCSB_TEST_IMAGE") else {})},
        pool={"size": 1, "refill_concurrency": 1},
    )
    plane = await app.start(settings)
    client = AsyncClient(plane.address, settings.token_file.read_text().strip())
    try:
        yield Plane(plane, client, settings.token_file.read_text().strip())
    finally:
        for session in await client.list_sessions():
            await client.delete_session(session.id)
        await client.close()
        await app.stop(plane)
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


async def wait_pool_full(plane: Plane) -> None:
    provider = plane.plane.sessions._provider
    deadline = time.monotonic() + 60
    while provider.pool_stats().ready < 1:
        assert time.monotonic() < deadline, "the warm pool did not fill"
        await asyncio.sleep(0.05)


async def test_global_dir_is_mounted_read_only_into_pooled_sandboxes() -> None:
    global_dir = make_global_dir()
    before = sorted(os.listdir(global_dir / "tool"))
    try:
        async with plane_with_global_dir(global_dir) as plane:
            await wait_pool_full(plane)
            hits = plane.plane.sessions._provider.pool_stats().hits
            project = {".opencode/tool/shared.ts": SHARED_PROJECT_TS, ".opencode/tool/echo.ts": ECHO_TS}
            session = await plane.client.create_session(workspace_archive=tar_of(project))
            assert plane.plane.sessions._provider.pool_stats().hits == hits + 1  # a pooled sandbox has it too

            listing = await plane.client.list_tools(session.id)
            tools = custom_tools(listing)
            # Global tools first (upstream's Config.directories()); the project's shared.ts wins the id but,
            # like a JS object key assigned again, stays in the global shared.ts's place, before echo.
            origins = {t.id: t.origin for t in tools.values()}
            assert list(origins) == ["operator", "operator_vandal", "shared", "echo"]
            assert origins == {
                "operator": f"{GLOBAL_DIR}/tool/operator.ts", "operator_vandal": f"{GLOBAL_DIR}/tool/operator.ts",
                "shared": "/workspace/.opencode/tool/shared.ts", "echo": "/workspace/.opencode/tool/echo.ts",
            }
            assert tools["shared"].description == "shared (project)"
            assert list(listing.load_errors) == []

            call = functools.partial(plane.client.execute_tool, on_permission=allow_once)
            assert (await call(session.id, "operator", {})).output == "global tool in /workspace"
            assert (await call(session.id, "shared", {})).output == "project wins"
            assert (await call(session.id, "operator_vandal", {})).output == "refused: EROFS"
            touched = await call(session.id, "bash", {
                "command": f"touch {GLOBAL_DIR}/tool/x.ts; echo rc=$?", "description": "Tries to write",
            })
            assert touched.output == f"touch: cannot touch '{GLOBAL_DIR}/tool/x.ts': Read-only file system\nrc=1\n"
            mounts = (await plane.client.run(session.id, ["grep", f" {GLOBAL_DIR} ", "/proc/self/mounts"])).stdout
            assert mounts.decode().split()[3].split(",")[0] == "ro"
        assert sorted(os.listdir(global_dir / "tool")) == before
    finally:
        shutil.rmtree(global_dir, ignore_errors=True)


async def test_a_missing_global_dir_is_a_config_error_at_start() -> None:
    data_dir = short_tmp()
    missing = data_dir / "no-such-dir"
    settings = load_settings(
        None, data_dir=data_dir, instance=new_instance("g"), server={"listen": "127.0.0.1:0"},
        provider={"type": "docker", "global_dir": str(missing)}, pool={"size": 0},
    )
    try:
        with pytest.raises(ConfigError, match=f"^provider.global_dir {missing} is not a directory on this host$"):
            await app.start(settings)
    finally:
        remove_data_dir(data_dir)


def test_a_writable_global_mount_fails_hardening() -> None:
    resources = Resources(1.0, 256, 64)
    attrs: dict[str, Any] = {
        "HostConfig": {
            "NetworkMode": "none", "CapDrop": ["ALL"], "CapAdd": ["SETUID"], "SecurityOpt": ["no-new-privileges"],
            "ReadonlyRootfs": True, "PidsLimit": 64, "Memory": 256 * 1024 * 1024, "NanoCpus": 1_000_000_000,
            "Tmpfs": code_mount.docker_tmpfs(256),
        },
        "Mounts": [{"Type": "bind", "Source": "/srv/tools", "Destination": GLOBAL_DIR, "RW": False}],
    }
    verify_hardening(attrs, resources, None)
    attrs["Mounts"][0]["RW"] = True
    with pytest.raises(HardeningError, match="the global tools dir is mounted writable"):
        verify_hardening(attrs, resources, None)
