"""Exec's operator patterns in a real sandbox, over the public API: under `"rm *" = "deny"` each respelling of
`rm victim` (and `sh` fed the command on stdin) is refused and `victim` stays; an ordinary command runs; a
tenant whose exec rules are whole-Exec only runs the same commands, so the refusals can fail."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from controlplane.client import AsyncClient
from tests.archives import tar_of
from tests.planes import Plane, running_plane

pytestmark = pytest.mark.docker

TENANTS = [{"name": "alpha", "token": "token-alpha"}, {"name": "open", "token": "token-open"}]
POLICY = {"permission": {"exec": {"*": "allow", "rm *": "deny"}}, "tenants": {"open": {"exec": "allow"}}}
FILES = {"victim": "keep me\n"}
RESPELLED: list[tuple[list[str], str]] = [
    (["/bin/rm", "/workspace/victim"], ""), (["sh", "-c", "rm victim"], ""), (["bash", "-c", "rm victim"], ""),
    ([], "true; rm victim"), (["env", "rm", "victim"], ""), ([], '"r"m victim'), ([], "$(echo rm) victim"),
    ([], "`echo rm` victim"), ([], "echo x | rm victim"), ([], "echo victim | xargs rm"),
    ([], "find . -name victim -exec rm {} \\;"), ([], "command rm victim"), ([], "exec rm victim"),
    (["busybox", "rm", "victim"], ""),
]


@pytest.fixture(scope="module")
async def plane() -> AsyncIterator[Plane]:
    async with running_plane("docker", tenants=TENANTS, policy=POLICY, pool={"size": 0}) as served:
        yield served


async def stdin_script() -> AsyncIterator[bytes]:
    yield b"rm victim\n"


async def files(client: AsyncClient, session_id: str) -> set[str]:
    return set((await client.run(session_id, ["ls", "-A", "/workspace"])).stdout.decode().split())


async def test_respellings_and_stdin_to_a_shell_are_refused_in_a_real_sandbox(plane: Plane) -> None:
    alpha = plane.client
    session = await alpha.create_session(workspace_archive=tar_of(FILES))
    for argv, command in RESPELLED:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await alpha.run(session.id, argv, command=command, cwd="/workspace")
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (argv, command, info.value.details())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await alpha.run(session.id, ["sh"], stdin=stdin_script(), cwd="/workspace")
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "victim" in await files(alpha, session.id)
    assert (await alpha.run(session.id, ["cat", "/workspace/victim"])).stdout == b"keep me\n"
    await alpha.delete_session(session.id)


async def test_the_same_commands_run_where_exec_is_allowed_whole(plane: Plane) -> None:
    """The control: each command above really would remove the file."""
    async with AsyncClient(plane.plane.address, "token-open") as opened:
        session = await opened.create_session(workspace_archive=tar_of(FILES))
        for argv, command in [*RESPELLED[:4], ([], "$(echo rm) victim")]:
            await opened.run(session.id, ["sh", "-c", "echo keep > /workspace/victim"])
            done = await opened.run(session.id, argv, command=command, cwd="/workspace")
            assert done.exit_code == 0, (argv, command, done.stderr)
            assert "victim" not in await files(opened, session.id), (argv, command)
        await opened.run(session.id, ["touch", "/workspace/victim"])
        assert (await opened.run(session.id, ["sh"], stdin=stdin_script(), cwd="/workspace")).exit_code == 0
        assert "victim" not in await files(opened, session.id)
        await opened.delete_session(session.id)
