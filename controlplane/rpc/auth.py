"""Bearer-token authentication: every RPC names a tenant (AdminService: the operator), except health and
reflection. A token revoked, rotated away, expired or deleted is refused from the next RPC on."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from controlplane.core.sessions.models import Tenant
from controlplane.core.tenants.quota import Slot, TenantQuotas
from controlplane.core.tenants.records import TokenDirectory
from controlplane.errors import ControlPlaneError, UnauthenticatedError
from controlplane.rpc.errors import abort_with
from controlplane.stream_accept import ACCEPTED

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
ADMIN_PREFIX = "/controlplane.v1.AdminService/"
MISSING = "missing `authorization: Bearer <token>` metadata"


def bearer(metadata: Sequence[tuple[str, Any]] | Any) -> str:
    header = next((str(v) for k, v in metadata or () if k == "authorization"), "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError(MISSING)
    return token.strip()


class Authenticator:
    def __init__(self, directory: TokenDirectory) -> None:
        self.directory = directory

    def tenant_for_token(self, token: str) -> Tenant | None:
        return self.directory.check(token)[0]

    def tenant(self, metadata: Sequence[tuple[str, Any]] | Any) -> Tenant:
        tenant, why = self.directory.check(bearer(metadata))
        if tenant is None:
            raise UnauthenticatedError(why)
        return tenant

    def tenant_of(self, context: grpc.aio.ServicerContext[Any, Any]) -> Tenant:
        return self.tenant(context.invocation_metadata())

    def admin(self, metadata: Sequence[tuple[str, Any]] | Any) -> None:
        if not self.directory.is_admin(bearer(metadata)):
            raise UnauthenticatedError("unknown admin token")


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects unauthenticated calls before any handler runs, and admits request streams (ExecuteTool, Exec:
    a tenant's calls) under its `calls` quota before saying they are accepted."""

    def __init__(self, authenticator: Authenticator, quotas: TenantQuotas | None = None) -> None:
        self._auth = authenticator
        self._quotas = quotas or TenantQuotas.unlimited()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        try:
            if handler_call_details.method.startswith(ADMIN_PREFIX):
                self._auth.admin(handler_call_details.invocation_metadata)
                return handler
            tenant = self._auth.tenant(handler_call_details.invocation_metadata)
        except UnauthenticatedError as exc:
            return _rejecting(handler, str(exc))
        return self._accepting(handler, tenant.name)

    def _accepting(self, handler: grpc.RpcMethodHandler[Any, Any], tenant: str) -> grpc.RpcMethodHandler[Any, Any]:
        """A request-streaming handler that takes a call slot, then says the call is accepted
        (controlplane.stream_accept): a refusal (quota) comes before the mark, so it reaches the client exactly."""
        if not handler.request_streaming:
            return handler
        return _streaming(handler, lambda: self._quotas.take_call(tenant), lambda: self._quotas.pause_refusal(tenant))


def _streaming(
    handler: grpc.RpcMethodHandler[Any, Any], admit: Callable[[], Slot], pause: Callable[[], Awaitable[None]],
) -> grpc.RpcMethodHandler[Any, Any]:
    inner: Any = handler.stream_stream if handler.response_streaming else handler.stream_unary

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            slot = admit()
        except ControlPlaneError as exc:
            await pause()
            await abort_with(context, exc)
            raise  # unreachable: abort raises
        try:
            await context.send_initial_metadata(ACCEPTED)
            result = inner(requests, context)
            if inspect.isasyncgen(result):
                async for response in result:
                    yield response
            else:
                await result
        finally:
            slot.release()

    async def stream_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            slot = admit()
        except ControlPlaneError as exc:
            await pause()
            await abort_with(context, exc)
            raise  # unreachable: abort raises
        try:
            await context.send_initial_metadata(ACCEPTED)
            return await inner(requests, context)
        finally:
            slot.release()

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            stream_stream, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.stream_unary_rpc_method_handler(
        stream_unary, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _rejecting(handler: grpc.RpcMethodHandler[Any, Any], message: str) -> grpc.RpcMethodHandler[Any, Any]:
    async def reject(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def reject_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        # Interceptors that wrap streaming handlers (tracing) iterate them, so this must be a generator.
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - abort raises

    kinds = (handler.request_streaming, handler.response_streaming)
    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kinds]
    return factory(
        reject_stream if handler.response_streaming else reject,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
