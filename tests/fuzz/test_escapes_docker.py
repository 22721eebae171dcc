"""Path and symlink escapes against a real sandbox (bounded): asks are rejected; nothing outside the
workspace changes except where the finding below says, and what the container protects stays protected."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import strategies as st

from controlplane.client import AsyncClient, PermissionRequest, allow_once
from controlplane.v1 import tool_pb2
from tests.fuzz.harness import run_given
from tests.fuzz.test_archives_fuzz import member, tar
from tests.planes import Plane

pytestmark = pytest.mark.docker
LINKS = {"link_tmp": "/tmp", "link_etc": "/etc", "link_agent": "/run/agent", "link_up": "..", "link_opt": "/opt/agent"}
PASSWD_LINE = "root:x:0:0:root:/root:/bin/bash"


async def _reject(_: PermissionRequest) -> tuple[int, str]:
    return tool_pb2.PermissionReply.REJECT, ""


@pytest.fixture(scope="module")
async def session_id(docker_plane: Plane) -> AsyncIterator[str]:
    # Links leading out are refused in an archive, so they are made the way a model's command would make them.
    session = await docker_plane.client.create_session(workspace_archive=tar([member("a.txt", data=b"one\n")]))
    links = " && ".join(f"ln -s {target} {name}" for name, target in LINKS.items())
    made = await docker_plane.client.run(session.id, command=links)
    assert (made.exit_code, made.stderr) == (0, b"")
    yield session.id
    await docker_plane.client.delete_session(session.id)


async def _outside_state(client: AsyncClient, session_id: str) -> str:
    # /tmp/home is the tool user's HOME: its tool-output dir is the plane's to write.
    done = await client.run(session_id, command="ls -la /tmp | grep -v ' home$'; ls -la /run/agent /opt/agent 2>&1; "
                                                "cat /etc/hostname; "
                                                "find / -xdev -name 'pwned*' 2>/dev/null | grep -v '^/proc' || true")
    return done.stdout.decode()


@st.composite
def escapes(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    path = draw(st.sampled_from([
        "/tmp/pwned.txt", "../tmp/pwned.txt", "/workspace/../tmp/pwned.txt", "/etc/passwd", "../etc/passwd",
        "/run/agent/pwned", "/proc/1/environ", "/opt/agent/sandbox_agent/pwned.py", "a.txt/../../etc/passwd",
    ]))
    tool = draw(st.sampled_from(["read", "write", "edit", "list", "grep", "glob"]))
    args = {
        "read": {"filePath": path}, "write": {"filePath": path, "content": "pwned"},
        "edit": {"filePath": path, "oldString": "root", "newString": "pwned"}, "list": {"path": path},
        "grep": {"pattern": "root", "path": path}, "glob": {"pattern": "*", "path": path},
    }[tool]
    return tool, args


async def test_paths_outside_the_workspace_are_asked_and_refused(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    before = await _outside_state(client, session_id)

    async def check(call: tuple[str, dict[str, str]]) -> None:
        tool, args = call
        out = await client.execute_tool(session_id, tool, args, on_permission=_reject)
        assert out.error is not None, (tool, args, out.result)
        assert PASSWD_LINE not in json.dumps(str(out.events)), (tool, args)

    await run_given(escapes(), check, max_examples=12)
    assert await _outside_state(client, session_id) == before


@pytest.mark.parametrize(("path", "error"), [
    ("link_etc/pwned.txt", "Read-only file system"),
    ("link_opt/pwned.py", "Read-only file system"),
    ("link_agent/pwned", "Permission denied"),
])
async def test_writes_through_symlinks_are_stopped_by_the_container(
    docker_plane: Plane, session_id: str, path: str, error: str
) -> None:
    client = docker_plane.client
    before = await _outside_state(client, session_id)
    refused = await client.execute_tool(session_id, "write", {"filePath": path, "content": "x"}, on_permission=_reject)
    assert [r.permission for r in refused.permission_requests] == ["external_directory"]
    assert refused.error is not None
    # Allowed anyway, the container still stops the write.
    out = await client.execute_tool(session_id, "write", {"filePath": path, "content": "x"}, on_permission=allow_once)
    assert out.error is not None
    assert error in out.error, out.error
    assert await _outside_state(client, session_id) == before


async def test_a_write_through_a_workspace_symlink_asks_external_directory(
    docker_plane: Plane, session_id: str
) -> None:
    client = docker_plane.client
    out = await client.execute_tool(
        session_id, "write", {"filePath": "link_tmp/pwned-link.txt", "content": "x"}, on_permission=_reject
    )
    try:
        assert [r.permission for r in out.permission_requests] == ["external_directory"]
        assert out.error is not None
    finally:
        await client.run(session_id, ["rm", "-f", "/tmp/pwned-link.txt"])
