"""A local MCP server (official TypeScript SDK, run by Bun) inside a real, hardened sandbox container.

Needs an image with `@modelcontextprotocol/sdk` in /node_modules (sandbox-image/node/package.json).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.core.calls.tool import Attachment, InitContext, PermissionAsk, ToolResult
from controlplane.core.seam.provider import Sandbox
from controlplane.mcp import LocalServer, McpCallError, McpServers, ServerStatus, mcp_tool_infos
from tests.archives import tar_of
from tests.planes import Plane
from tests.tool_uids import tool_uid
from tests.unit.mcp.test_mcp_stdio import make_context

pytestmark = pytest.mark.docker

SERVER_TS = (Path(__file__).with_name("mcp_stdio_server.ts")).read_text()
BUN_SERVER = ["bun", "run", "--no-install", "mcp_stdio_server.ts"]


@pytest.fixture(scope="module")
async def session_sandbox(docker_plane: Plane) -> AsyncIterator[tuple[str, Sandbox]]:
    session = await docker_plane.client.create_session(workspace_archive=tar_of({"mcp_stdio_server.ts": SERVER_TS}))
    sandbox = await docker_plane.plane.sessions.sandbox_for(session.tenant, session.id)
    yield session.id, sandbox
    await docker_plane.client.delete_session(session.id)


async def test_typescript_server_in_the_sandbox(docker_plane: Plane, session_sandbox: tuple[str, Sandbox]) -> None:
    session_id, sandbox = session_sandbox
    mcp = McpServers(sandbox.agent, {
        "ts": LocalServer(type="local", command=BUN_SERVER,
                          environment={"GREETING": "hello", "MARKER": "/workspace/cancelled"}),
        "missing": LocalServer(type="local", command=["npx", "-y", "some-server"]),
    })
    try:
        assert await mcp.connect_all() == {
            "ts": ServerStatus("connected"),
            "missing": ServerStatus("failed", "cannot run 'npx': no such file or directory"),
        }
        infos = {i.id: i for i in mcp_tool_infos(mcp)}
        assert list(infos) == ["ts_echo", "ts_whoami", "ts_picture", "ts_slow"]
        echo = await infos["ts_echo"].init(InitContext())
        assert echo.description == "Echoes text"
        assert echo.schema() == {
            "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"text": {"type": "string"}}, "required": ["text"], "additionalProperties": False,
        }

        asks: list[PermissionAsk] = []
        assert await echo.execute({"text": "from the sandbox"}, make_context(asks)) == ToolResult(
            title="", output="from the sandbox")
        assert asks == [PermissionAsk(permission="ts_echo", patterns=["*"], always=["*"], metadata={})]

        whoami = await infos["ts_whoami"].init(InitContext())
        # The server runs as the tool user, in the workspace, with its configured environment.
        uid = tool_uid(docker_plane.instance, sandbox.id)
        assert (await whoami.execute({}, make_context([]))).output == f"{uid}|/workspace|hello"

        picture = await infos["ts_picture"].init(InitContext())
        result = await picture.execute({}, make_context([]))
        assert result.output == "caption"
        assert result.attachments == [Attachment(mime="image/png", url="data:image/png;base64,iVBORw0KGgo=")]

        abort = asyncio.Event()
        slow = await infos["ts_slow"].init(InitContext())
        call = asyncio.ensure_future(slow.execute({"seconds": 30}, make_context([], abort)))
        await asyncio.sleep(0.3)
        abort.set()
        with pytest.raises(McpCallError) as caught:
            await asyncio.wait_for(call, 3)
        assert str(caught.value) == "Tool execution aborted"
        for _ in range(40):  # the server writes its marker when the cancellation reaches it
            done = await docker_plane.client.run(session_id, ["cat", "/workspace/cancelled"])
            if done.stdout == b"cancelled":
                break
            await asyncio.sleep(0.05)
        assert done.stdout == b"cancelled"
    finally:
        await mcp.close()
    # Closing ended the server process inside the container.
    deadline = time.monotonic() + 5
    while True:
        done = await docker_plane.client.run(session_id, ["pgrep", "-f", "mcp_stdio_server"])
        if done.exit_code == 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert done.exit_code == 1, done.stdout
