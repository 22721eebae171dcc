"""An open stream lives exactly as long as its token (controlplane.rpc.token_watch), over real gRPC.

The sandboxes are in-process agents (the local provider): what is tested is the control plane ending the
stream and its work; tests/docker/test_token_streams_docker.py runs the same against real containers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from controlplane.admin_client import AsyncAdminClient
from controlplane.client import AsyncClient
from controlplane.core.tenants.lifecycle import REFRESH_S
from controlplane.core.tenants.records import MAX_TOKEN_BYTES
from controlplane.errors import InvalidArgumentError
from controlplane.rpc.server import MAX_METADATA_BYTES
from controlplane.v1 import sandbox_pb2, session_pb2, tool_pb2
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
ASK_TOUCH = json.dumps({"permission": {"bash": {"*": "allow", "touch *": "ask"}}})
PROMPT_S = 1.0
"""How soon running work must end after a change on this plane."""

plane = served_plane("local", scope="module", tenants=TENANTS, pool={"size": 0})


def admin_of(served: Plane) -> AsyncAdminClient:
    return AsyncAdminClient(served.plane.address, served.plane.settings.admin_token_file.read_text().strip())


async def unauthenticated(stream: Any) -> tuple[str, list[Any]]:
    """Reads `stream` to its end, which must be UNAUTHENTICATED: (details, the events read)."""
    seen: list[Any] = []

    async def read() -> None:
        async for event in stream:
            seen.append(event)

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await read()
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value.details()
    return info.value.details() or "", seen


class Stdin:
    """An Exec's stdin fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (data := await self.queue.get()) is not None:
            yield data


async def until_stdout(stream: Any, text: bytes) -> list[Any]:
    seen: list[Any] = []
    async for event in stream:
        seen.append(event)
        if text in b"".join(e.stdout for e in seen):
            return seen
    raise AssertionError(f"the stream ended before {text!r}")


async def audited(served: Plane, tenant: str, kind: str) -> list[Any]:
    await served.plane.audit.flush()
    return [e for e in await served.plane.store.audit_entries(tenant) if e.kind == kind]


# -- the ways a token dies -------------------------------------------------------------------------

Kill = Callable[[AsyncAdminClient, str], Awaitable[str]]
"""Ends the tenant's token; returns the reason the stream must end with."""


async def _revoke(admin: AsyncAdminClient, name: str) -> str:
    await admin.revoke_token(name)
    return "bearer token revoked"


async def _rotate(admin: AsyncAdminClient, name: str) -> str:
    await admin.rotate_token(name)
    return "unknown bearer token"


async def _delete(admin: AsyncAdminClient, name: str) -> str:
    await admin.delete_tenant(name)
    return "bearer token revoked"


KILLS: dict[str, Kill] = {"revoke": _revoke, "rotate": _rotate, "delete": _delete}


async def new_tenant(admin: AsyncAdminClient, served: Plane, name: str, ttl_s: float = 0) -> tuple[
    AsyncClient, float
]:
    made = await admin.create_tenant(name, ttl_s=ttl_s)
    return AsyncClient(served.plane.address, made.token), made.tenant.expires_at


# -- 1. every inbound message re-checks the token ---------------------------------------------------

@pytest.mark.parametrize("how", ["revoke", "rotate", "delete", "expire"])
async def test_stdin_sent_after_the_token_died_is_not_delivered(plane: Plane, how: str) -> None:
    name = f"stdin-{how}"
    async with admin_of(plane) as admin:
        client, expires_at = await new_tenant(admin, plane, name, ttl_s=4.0 if how == "expire" else 0)
        session = await client.create_session()
        stdin = Stdin()
        # Each line goes to the log before it is echoed, so an echoed line is in the log.
        echo = 'while read -r line; do echo "$line" >> log; echo "$line"; done'
        stream = client.exec_call(session.id, ["sh", "-c", echo], stdin=aiter(stdin))
        stdin.queue.put_nowait(b"before\n")
        await until_stdout(stream, b"before\n")
        if how == "expire":
            await asyncio.sleep(max(0.0, expires_at - time.time()) + 0.05)
            want = "bearer token expired"
        else:
            want = await KILLS[how](admin, name)
        stdin.queue.put_nowait(b"after\n")
        details, rest = await unauthenticated(stream)
        assert details == want
        assert b"after" not in b"".join(e.stdout for e in rest)
        if how != "delete":  # the workspace as the tenant finds it with a new token
            renewed = await admin.rotate_token(name)
            async with AsyncClient(plane.plane.address, renewed.token) as again:
                assert (await again.run(session.id, ["cat", "log"])).stdout == b"before\n"
            await admin.delete_tenant(name)
        await client.close()


async def test_a_once_reply_after_revoke_does_not_run_the_call(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        client, _ = await new_tenant(admin, plane, "asker")
        session = await client.create_session(config_json=ASK_TOUCH)
        stream, outbox = client.tool_call(session.id, "bash", {"command": "touch marker", "description": "touch"})
        async for event in stream:
            if event.WhichOneof("event") == "permission_request":
                asked = event.permission_request
                break
        await admin.revoke_token("asker")
        outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=tool_pb2.PermissionReply(
            request_id=asked.id, reply=tool_pb2.PermissionReply.ONCE,
        )))
        details, _ = await unauthenticated(stream)
        assert details == "bearer token revoked"
        await asyncio.sleep(0.3)  # time for a call the reply had let through to run
        renewed = await admin.rotate_token("asker")
        async with AsyncClient(plane.plane.address, renewed.token) as again:
            assert (await again.run(session.id, ["ls", "-a"])).stdout.split() == [b".", b".."]
            assert await again.pending_permissions(session.id) == []
        calls = await audited(plane, "asker", "call")
        assert [(c.tool, c.outcome) for c in calls] == [("bash", "cancelled")]
        await admin.delete_tenant("asker")
        await client.close()


# -- 2. running work ends when the token dies -------------------------------------------------------

@pytest.mark.parametrize("how", ["revoke", "rotate", "delete"])
async def test_a_running_exec_is_aborted_when_its_token_dies(plane: Plane, how: str) -> None:
    name = f"exec-{how}"
    async with admin_of(plane) as admin:
        client, _ = await new_tenant(admin, plane, name)
        session = await client.create_session()
        stream = client.exec_call(session.id, ["sh", "-c", "echo up; sleep 30; echo never"])
        await until_stdout(stream, b"up\n")
        began = time.monotonic()
        want = await KILLS[how](admin, name)
        details, rest = await unauthenticated(stream)
        took = time.monotonic() - began
        assert details == want
        assert took < PROMPT_S, f"ended {took:.2f}s after the change"
        assert b"never" not in b"".join(e.stdout for e in rest)
        ended = await audited(plane, name, "stream")
        assert [(e.session_id, e.tool, e.outcome) for e in ended] == [(session.id, "Exec", "cancelled")]
        assert want in ended[0].detail
        execs = [(e.outcome, e.detail) for e in await audited(plane, name, "exec")]
        assert execs == [("cancelled", f"aborted, its token died: {want}")]
        if how != "delete":
            await admin.delete_tenant(name)
        await client.close()


async def test_a_running_bash_call_is_aborted_on_revoke_and_audited(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        client, _ = await new_tenant(admin, plane, "basher")
        session = await client.create_session()
        stream, _ = client.tool_call(
            session.id, "bash", {"command": "echo up; sleep 30; touch late", "description": "sleeps"}, call_id="c1",
        )
        async for event in stream:
            if event.WhichOneof("event") == "metadata" and "up" in event.metadata.metadata_json:
                break
        began = time.monotonic()
        await admin.revoke_token("basher")
        details, _ = await unauthenticated(stream)
        assert details == "bearer token revoked"
        assert time.monotonic() - began < PROMPT_S
        for _ in range(100):  # the executor audits the call once the sandbox confirms the abort
            calls = await audited(plane, "basher", "call")
            if calls:
                break
            await asyncio.sleep(0.05)
        # bash reports what an aborted command printed, so the call's own row may say ok; this one says why.
        assert [c.call_id for c in calls] == ["c1"]
        ended = await audited(plane, "basher", "stream")
        assert [(e.call_id, e.tool, e.detail) for e in ended] == [
            ("c1", "bash", "ExecuteTool ended, its work aborted: bearer token revoked")
        ]
        renewed = await admin.rotate_token("basher")
        async with AsyncClient(plane.plane.address, renewed.token) as again:
            await asyncio.sleep(0.2)
            assert (await again.run(session.id, ["ls"])).stdout == b""  # `touch late` never ran
        await admin.delete_tenant("basher")
        await client.close()


async def test_an_expiring_token_ends_a_running_exec_at_its_time(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        client, expires_at = await new_tenant(admin, plane, "brief", ttl_s=3.0)
        session = await client.create_session()
        stream = client.exec_call(session.id, ["sh", "-c", "echo up; sleep 30"])
        await until_stdout(stream, b"up\n")
        details, _ = await unauthenticated(stream)  # nothing is sent: the timer ends it
        assert details == "bearer token expired"
        assert -0.05 < time.time() - expires_at < PROMPT_S
        await admin.delete_tenant("brief")
        await client.close()


async def test_an_open_subscription_ends_at_once_on_revoke(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        client, _ = await new_tenant(admin, plane, "listener")
        events = client.subscribe_events()
        await events.initial_metadata()
        began = time.monotonic()
        await admin.revoke_token("listener")  # no event follows: the watch, not the next event, ends it
        details, _ = await unauthenticated(events)
        assert details == "bearer token revoked"
        assert time.monotonic() - began < PROMPT_S
        await admin.delete_tenant("listener")
        await client.close()


async def test_streams_of_other_tenants_and_unchanged_refreshes_are_left_alone(plane: Plane) -> None:
    async with admin_of(plane) as admin:
        client, _ = await new_tenant(admin, plane, "doomed")
        session = await plane.client.create_session()
        stdin = Stdin()
        stream = plane.client.exec_call(session.id, ["cat"], stdin=aiter(stdin))
        stdin.queue.put_nowait(b"one\n")
        await until_stdout(stream, b"one\n")
        directory = plane.plane.tenants.directory if plane.plane.tenants else None
        assert directory is not None
        epoch = directory.epoch
        await asyncio.sleep(REFRESH_S * 1.5)  # a refresh that finds nothing new moves nothing
        assert directory.epoch == epoch
        await admin.delete_tenant("doomed")
        stdin.queue.put_nowait(b"two\n")
        await until_stdout(stream, b"two\n")
        stdin.queue.put_nowait(None)
        assert [e.exited.exit_code async for e in stream if e.WhichOneof("event") == "exited"] == [0]
        await plane.client.delete_session(session.id)
        await client.close()


# -- 3. a long wrong token is UNAUTHENTICATED ------------------------------------------------------

@pytest.mark.parametrize("size", [MAX_TOKEN_BYTES + 1, 16 * 1024, 64 * 1024, MAX_METADATA_BYTES - 1024])
async def test_a_long_wrong_token_is_unauthenticated(plane: Plane, size: int) -> None:
    metadata = (("authorization", "Bearer " + "x" * size),)
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        unary = channel.unary_unary(
            "/controlplane.v1.SessionService/ListSessions",
            request_serializer=session_pb2.ListSessionsRequest.SerializeToString,
            response_deserializer=session_pb2.ListSessionsResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await unary(session_pb2.ListSessionsRequest(), metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value.details()
        assert info.value.details() == f"bearer token is {size} bytes, longer than the {MAX_TOKEN_BYTES} bytes" \
            " a token can be"
        streaming = channel.stream_stream(
            "/controlplane.v1.SandboxService/Exec",
            request_serializer=sandbox_pb2.ExecRequest.SerializeToString,
            response_deserializer=sandbox_pb2.ExecEvent.FromString,
        )
        details, _ = await unauthenticated(streaming(metadata=metadata))
        assert details.startswith(f"bearer token is {size} bytes")


async def test_the_client_library_refuses_a_token_it_could_not_send(plane: Plane) -> None:
    with pytest.raises(InvalidArgumentError, match=f"longer than the {MAX_TOKEN_BYTES} bytes"):
        AsyncClient(plane.plane.address, "x" * (MAX_TOKEN_BYTES + 1))
    with pytest.raises(InvalidArgumentError, match="token file holds the token alone"):
        AsyncAdminClient(plane.plane.address, "y" * (MAX_TOKEN_BYTES + 1))
    async with AsyncClient(plane.plane.address, "z" * MAX_TOKEN_BYTES) as longest_wrong:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await longest_wrong.list_sessions()
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")
