"""Every public RPC refuses a call without a known bearer token before its handler runs.

Walks every method of every registered public service (rpc/server.py SERVICES): the interceptor must
cover each of them, whatever the method's streaming shape.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.rpc.server import SERVICES
from tests.planes import Plane, served_plane

TENANTS = [{"name": "alpha", "token": "token-alpha"}]
BAD_METADATA = [
    (),
    (("authorization", "Bearer wrong"),),
    (("authorization", "Basic token-alpha"),),
    (("authorization", "Bearer "),),
]


plane = served_plane("local", tenants=TENANTS)


def _methods() -> list[tuple[str, bool, bool]]:
    return [
        (f"/{service.full_name}/{method.name}", method.client_streaming, method.server_streaming)
        for service in SERVICES
        for method in service.methods
    ]


async def _call(channel: grpc.aio.Channel, path: str, client_streaming: bool, server_streaming: bool,
                metadata: tuple[tuple[str, str], ...]) -> None:
    """An empty request (valid for every request type); a streaming request side sends nothing at all.

    The refusal must come before the handler reads anything, and a client that writes after the server
    ended the call may see its own write fail first (INTERNAL) instead of the server's status.
    """
    if client_streaming and server_streaming:
        async for _ in channel.stream_stream(path)(metadata=metadata, timeout=10):
            pass
    elif server_streaming:
        unary_stream: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path)
        async for _ in unary_stream(b"", metadata=metadata, timeout=10):
            pass
    elif client_streaming:
        await channel.stream_unary(path)(metadata=metadata, timeout=10)
    else:
        unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
        await unary(b"", metadata=metadata, timeout=10)


def test_every_public_service_is_listed() -> None:
    names = {service.full_name for service in SERVICES}
    assert names == {
        "controlplane.v1.SessionService", "controlplane.v1.SandboxService", "controlplane.v1.ToolService",
        "controlplane.v1.PermissionService", "controlplane.v1.QuestionService", "controlplane.v1.EventService",
        "controlplane.v1.FileService",
        "controlplane.v1.AuditService",
    }
    assert all(service.methods for service in SERVICES)


@pytest.mark.parametrize(("path", "client_streaming", "server_streaming"), _methods(), ids=lambda v: str(v))
async def test_every_method_refuses_a_missing_or_unknown_token(
    plane: Plane, path: str, client_streaming: bool, server_streaming: bool,
) -> None:
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        for metadata in BAD_METADATA:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _call(channel, path, client_streaming, server_streaming, metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, metadata, info.value.details())
            details = info.value.details() or ""
            assert details in ("unknown bearer token", "missing `authorization: Bearer <token>` metadata"), details


async def test_a_refused_call_changes_nothing(plane: Plane) -> None:
    """CreateSession with a wrong token creates nothing: the handler never ran."""
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(channel, "/controlplane.v1.SessionService/CreateSession", False, False,
                        (("authorization", "Bearer wrong"),))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await plane.client.list_sessions() == []


async def test_health_stays_open(plane: Plane) -> None:
    async with grpc.aio.insecure_channel(plane.plane.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reload_tools_is_among_the_methods_walked() -> None:
    # ReloadTools is the caller's way to let new workspace code run: it must never be reachable unauthenticated.
    assert ("/controlplane.v1.ToolService/ReloadTools", False, False) in _methods()
