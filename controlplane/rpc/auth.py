"""Bearer-token authentication: every RPC names a tenant, except health and reflection."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from controlplane.core.sessions.models import Tenant
from controlplane.errors import UnauthenticatedError
from controlplane.store.sqlite import hash_token

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class Authenticator:
    def __init__(self, tokens: dict[str, Tenant]) -> None:
        self._tokens = tokens  # sha256(token) -> tenant

    def tenant_for_token(self, token: str) -> Tenant | None:
        digest = hash_token(token)
        for known, tenant in self._tokens.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None

    def tenant(self, metadata: Sequence[tuple[str, Any]] | Any) -> Tenant:
        header = next((str(v) for k, v in metadata or () if k == "authorization"), "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError("missing `authorization: Bearer <token>` metadata")
        tenant = self.tenant_for_token(token.strip())
        if tenant is None:
            raise UnauthenticatedError("unknown bearer token")
        return tenant

    def tenant_of(self, context: grpc.aio.ServicerContext[Any, Any]) -> Tenant:
        return self.tenant(context.invocation_metadata())


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
            self._auth.tenant(handler_call_details.invocation_metadata)
        except UnauthenticatedError as exc:
            return _rejecting(handler, str(exc))
        return handler


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
