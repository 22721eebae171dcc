"""A model that fills the workspace disk cannot make the file tools lose what the user shipped: `write`,
`edit`, `multiedit` and `apply_patch` that meet a full disk fail with the old content whole (they cut the
file first and left it truncated or empty before: a red-team finding), and a new file they could not fill is
not left behind half-written. Real containers, a 32 MiB workspace disk filled by the tool user."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import Plane, served_plane

pytestmark = pytest.mark.docker

plane = served_plane("docker", resources={"disk_mb": 32}, pool={"size": 0})
BIG = "".join(f"line {i:07d} precious user data\n" for i in range(30000))  # about 0.9 MiB
SMALL = "keep me\n" * 1000


async def _sh(client: AsyncClient, session_id: str, script: str) -> str:
    done = await client.run(session_id, ["/bin/sh", "-c", script], cwd="/workspace")
    return done.stdout.decode()


async def _digest(client: AsyncClient, session_id: str, name: str) -> str:
    return hashlib.sha256(await client.read_file(session_id, name)).hexdigest()


async def test_a_full_disk_never_truncates_a_file_a_tool_rewrites(plane: Plane) -> None:
    client = plane.client
    session = await client.create_session(
        config_json=json.dumps({"permission": {"bash": "deny", "edit": "allow"}}),
        workspace_archive=tar_of({"big.txt": BIG, "small.txt": SMALL}),
    )
    try:
        before = {name: await _digest(client, session.id, name) for name in ("big.txt", "small.txt")}
        for name in ("big.txt", "small.txt"):  # the edits below need a read first, as upstream's do
            assert (await client.execute_tool(session.id, "read", {"filePath": f"/workspace/{name}"})).error is None
        # The tool user fills the disk to the last block.
        await _sh(client, session.id, "dd if=/dev/zero of=fill bs=1M 2>/dev/null; dd if=/dev/zero of=fill2 bs=4k "
                                      "2>/dev/null; dd if=/dev/zero of=fill3 bs=512 2>/dev/null; true")
        grow = "HEADER\n" * 200_000
        attempts: dict[str, tuple[str, dict[str, Any]]] = {
            "edit": ("edit", {"filePath": "/workspace/big.txt", "oldString": "line 0000000 precious user data\n",
                              "newString": grow + "line 0000000 precious user data\n"}),
            "write": ("write", {"filePath": "/workspace/small.txt", "content": "new\n" * 400_000}),
            "multiedit": ("multiedit", {"filePath": "/workspace/big.txt", "edits": [
                {"oldString": "line 0000001 precious user data\n", "newString": grow}]}),
            "apply_patch": ("apply_patch", {"patchText": "*** Begin Patch\n*** Update File: small.txt\n@@\n-keep me\n+"
                                            + "x" * 3_000_000 + "\n*** End Patch"}),
            "new file": ("write", {"filePath": "/workspace/fresh.txt", "content": "n" * 3_000_000}),
        }
        for what, (tool, args) in attempts.items():
            outcome = await client.execute_tool(session.id, tool, args)
            assert outcome.error is not None, what  # the disk is full: the call fails ...
            for name, digest in before.items():  # ... and every shipped file is whole
                assert await _digest(client, session.id, name) == digest, (what, name)
        assert "fresh.txt" not in await _sh(client, session.id, "ls")
        # Once there is room again, the same edit works.
        await _sh(client, session.id, "rm -f fill fill2 fill3")
        outcome = await client.execute_tool(session.id, *attempts["edit"])
        assert outcome.error is None, outcome.error
        assert (await client.read_file(session.id, "big.txt")).decode().startswith("HEADER\n")
    finally:
        await client.delete_session(session.id)
