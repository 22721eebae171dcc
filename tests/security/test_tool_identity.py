"""The file tools read as the tool user, whether on an io thread or on the agent's loop thread.

Small files and short bash scans are handled on the agent's own thread under the tool user's filesystem
identity (`ToolRunner.io_now`); larger ones on io threads. Either way a file the tool user may not read
stays unread, one it owns is read, and the agent's thread is back to its own identity afterwards.
"""

from __future__ import annotations

import docker
import pytest

from controlplane.client import AsyncClient, PermissionRequest, allow_once
from tests.archives import tar_of
from tests.planes import Plane
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.docker

BIG = 200 * 1024
"""Larger than read's on-thread limit (64 KiB): read through an io thread."""


async def _bash(client: AsyncClient, session_id: str, command: str) -> str:
    outcome = await client.execute_tool(session_id, "bash", {"command": command, "description": "Setup"})
    assert outcome.error is None, outcome.error
    return outcome.output


async def _read(client: AsyncClient, session_id: str, path: str) -> tuple[str, str | None]:
    # Paths outside the workspace ask external_directory: approved, so that the identity is what refuses.
    outcome = await client.execute_tool(session_id, "read", {"filePath": path}, on_permission=allow_once)
    return (outcome.output if outcome.error is None else ""), outcome.error


def _agent_fs_ids(container_id: str) -> tuple[str, str]:
    """The agent main thread's filesystem uid and gid, from its /proc status (fourth column of Uid/Gid);
    the agent holds no supplementary group (the tool user's filesystem identity would keep it)."""
    container = docker.from_env().containers.get(container_id)
    top = container.top(ps_args="-eo pid,args")["Processes"]
    agent = next(int(row[0]) for row in top if row[1].startswith("python3 -m sandbox_agent"))
    with open(f"/proc/{agent}/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    assert status["Groups"].strip() == ""
    return status["Uid"].split()[3], status["Gid"].split()[3]


async def test_read_keeps_the_tool_users_identity_on_both_paths(docker_plane: Plane) -> None:
    client = docker_plane.client
    session = await client.create_session(workspace_archive=tar_of({"hello.txt": "hi\n"}))
    try:
        await _bash(client, session.id, (
            f"umask 077 && echo secret > mine.txt && head -c {BIG} /dev/zero | tr '\\0' 'a' > big-mine.txt"
            f" && echo locked > locked.txt && chmod 000 locked.txt"
            f" && cp big-mine.txt big-locked.txt && chmod 000 big-locked.txt && echo ok"
        ))
        sandbox = await docker_plane.plane.sessions._provider.get(session.sandbox_id)
        container_id = str(sandbox.details["container_id"])

        # Files the tool user owns, mode 0600: readable, small (loop thread) and big (io thread).
        output, error = await _read(client, session.id, "/workspace/mine.txt")
        assert error is None
        assert "1: secret" in output
        output, error = await _read(client, session.id, "/workspace/big-mine.txt")
        assert error is None
        assert "1: aaaa" in output

        # Mode 000 (even for the owner), root-only files and directories: refused on both paths.
        for path in ("/workspace/locked.txt", "/workspace/big-locked.txt", "/etc/shadow",
                     "/root/.bashrc"):
            output, error = await _read(client, session.id, path)
            assert error is not None, (path, output[:200])
            assert "permission denied" in error.lower() or "EACCES" in error, (path, error)
            assert "root:" not in error
            assert "locked" not in output

        # The agent's own thread is itself again: root's filesystem identity, and it still serves.
        assert _agent_fs_ids(container_id) == ("0", "0")
        output, error = await _read(client, session.id, "/workspace/hello.txt")
        assert error is None
        assert "1: hi" in output
        assert (await client.run(session.id, ["true"])).exit_code == 0
    finally:
        await client.delete_session(session.id)


async def test_bash_scans_short_and_long_commands_and_the_agent_stays_itself(docker_plane: Plane) -> None:
    """A short command is scanned on the loop thread, a long one on an io thread: both run, both still ask
    for the paths outside the project they name, and the agent's thread ends with its own identity."""
    client = docker_plane.client
    session = await client.create_session()
    asked: list[str] = []

    async def record(request: PermissionRequest) -> tuple[int, str]:
        asked.extend(request.patterns)
        return await allow_once(request)

    try:
        for command in ("cat /etc/hostname >/dev/null; echo done",
                        "cat /etc/hostname >/dev/null; " + "true; " * 900 + "echo done"):
            asked.clear()
            outcome = await client.execute_tool(session.id, "bash", {"command": command, "description": "Probe"},
                                                on_permission=record)
            assert outcome.error is None, outcome.error
            assert outcome.output == "done\n"
            assert "/etc/*" in asked
        sandbox = await docker_plane.plane.sessions._provider.get(session.sandbox_id)
        assert _agent_fs_ids(str(sandbox.details["container_id"])) == ("0", "0")
    finally:
        await client.delete_session(session.id)


async def test_write_and_edit_act_as_the_tool_user(docker_plane: Plane) -> None:
    """Small files are loaded and stored on the loop thread: as the tool user, never as the agent."""
    client = docker_plane.client
    session = await client.create_session(workspace_archive=tar_of({"notes.txt": "one\n"}))
    try:
        read = await client.execute_tool(session.id, "read", {"filePath": "/workspace/notes.txt"})
        assert read.error is None
        edited = await client.execute_tool(session.id, "edit", {
            "filePath": "/workspace/notes.txt", "oldString": "one", "newString": "two",
        })
        assert edited.error is None, edited.error
        written = await client.execute_tool(session.id, "write", {"filePath": "/workspace/new.txt", "content": "x\n"})
        assert written.error is None, written.error
        owners = await _bash(client, session.id, "stat -c '%u %n' new.txt notes.txt && cat notes.txt")
        uid = tool_uid(docker_plane.instance, session.sandbox_id)
        assert owners == f"{uid} new.txt\n{uid} notes.txt\ntwo\n"

        refused = await client.execute_tool(session.id, "write", {"filePath": "/root/planted.txt", "content": "x"},
                                            on_permission=allow_once)
        assert refused.error is not None
        assert "permission denied" in refused.error.lower() or "EACCES" in refused.error
        sandbox = await docker_plane.plane.sessions._provider.get(session.sandbox_id)
        assert _agent_fs_ids(str(sandbox.details["container_id"])) == ("0", "0")
    finally:
        await client.delete_session(session.id)
