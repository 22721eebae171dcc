"""A revoked token aborts work already running in a real container: a `sleep` Exec and a bash tool call
(tests/rpc/test_token_streams.py covers every way a token dies, with in-process agents)."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from tests.planes import Plane

PROMPT_S = 1.0


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_a_revoke_aborts_a_running_sleep_exec_and_a_running_bash_call(docker_plane: Plane) -> None:
    admin_token = docker_plane.plane.settings.admin_token_file.read_text().strip()
    async with AsyncAdminClient(docker_plane.plane.address, admin_token) as admin:
        made = await admin.create_tenant("sleeper")
        async with AsyncClient(docker_plane.plane.address, made.token) as sleeper:
            session = await sleeper.create_session()
            execs = sleeper.exec_call(session.id, ["sh", "-c", "echo up; sleep 60"])
            async for event in execs:
                if event.stdout == b"up\n":
                    break
            call, _ = sleeper.tool_call(session.id, "bash", {"command": "echo up; sleep 60", "description": "s"})
            async for tool_event in call:
                if tool_event.WhichOneof("event") == "metadata" and "up" in tool_event.metadata.metadata_json:
                    break
            began = time.monotonic()
            await admin.revoke_token("sleeper")
            for stream in (execs, call):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _drain(stream)
                assert (info.value.code(), info.value.details()) == (
                    grpc.StatusCode.UNAUTHENTICATED, "bearer token revoked"
                )
            assert time.monotonic() - began < PROMPT_S
            sandbox = docker_plane.plane.sessions.live_session(session.id)
            assert sandbox is not None
            renewed = await admin.rotate_token("sleeper")
            async with AsyncClient(docker_plane.plane.address, renewed.token) as again:
                left = await again.run(session.id, ["sh", "-c", "ps -eo args | grep -c '^sleep 60' || true"])
                assert left.stdout.strip() == b"0", "a sleep outlived its aborted stream"
            await admin.delete_tenant("sleeper")
