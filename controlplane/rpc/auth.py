"""Bearer-token authentication: every RPC names a tenant (AdminService: the operator), except health and
reflection. A token revoked, rotated away, expired or deleted is refused from the next RPC on."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from controlplane.core.sessions.models import Tenant
from controlplane.core.tenants.records import TokenDirectory
from controlplane.errors import UnauthenticatedError
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
    """Rejects unauthenticated calls before any handler runs."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator

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
            else:
                self._auth.tenant(handler_call_details.invocation_metadata)
        except UnauthenticatedError as exc:
            return _rejecting(handler, str(exc))
        return _accepting(handler)


def _accepting(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """A request-streaming handler that first says the call is accepted (controlplane.stream_accept)."""
    if not handler.request_streaming:
        return handler
    inner: Any = handler.stream_stream if handler.response_streaming else handler.stream_unary

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await context.send_initial_metadata(ACCEPTED)
        result = inner(requests, context)
        if inspect.isasyncgen(result):
            async for response in result:
                yield response
        else:
            await result

    async def stream_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.send_initial_metadata(ACCEPTED)
        return await inner(requests, context)

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
