"""Bearer-token authentication: every RPC names a tenant (AdminService: the operator), except health and
reflection. A token revoked, rotated away, expired or deleted is refused from the next RPC on, and ends
the streams it opened (token_watch)."""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from controlplane.core.permissions.audit import AuditEntry, AuditLog, CoalescedRefusals, NoAudit
from controlplane.core.sessions.models import Tenant
from controlplane.core.tenants.quota import Slot, TenantQuotas
from controlplane.core.tenants.records import TokenDirectory, token_too_long
from controlplane.core.tenants.refusals import HELD_STREAM_BYTES, MAX_TOKEN_REFUSAL_BYTES, RefusalGate
from controlplane.errors import ControlPlaneError, UnauthenticatedError
from controlplane.rpc.errors import abort_with
from controlplane.rpc.token_watch import StreamGuard
from controlplane.stream_accept import ACCEPTED

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
ADMIN_PREFIX = "/controlplane.v1.AdminService/"
MISSING = "missing `authorization: Bearer <token>` metadata"
AUDITED_CALLS = {
    "/controlplane.v1.SandboxService/Exec": ("exec", "exec"),
    "/controlplane.v1.ToolService/ExecuteTool": ("call", ""),
}
"""(kind, tool) of the audit row a refused call leaves: refused before its first message, it names no
session (nor, for ExecuteTool, a tool)."""


def bearer(metadata: Sequence[tuple[str, Any]] | Any) -> str:
    header = next((str(v) for k, v in metadata or () if k == "authorization"), "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError(MISSING)
    too_long = token_too_long(token.strip())
    if too_long:  # refused before any hashing or comparing
        raise UnauthenticatedError(too_long)
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
    """Rejects unauthenticated calls before any handler runs, admits request streams (ExecuteTool, Exec:
    a tenant's calls) under its `calls` quota and its fair share of the calls (waiting its turn,
    controlplane.core.tenants.call_share) before saying they are accepted, and keeps every stream
    under its token for as long as it is open (controlplane.rpc.token_watch)."""

    def __init__(
        self, authenticator: Authenticator, quotas: TenantQuotas | None = None, audit: AuditLog | None = None,
    ) -> None:
        self._auth = authenticator
        self._quotas = quotas or TenantQuotas.unlimited()
        self._guard = StreamGuard(authenticator.directory, audit)
        self._refusals = CoalescedRefusals(audit or NoAudit())
        self._token_refusals = RefusalGate(forget_idle=True, max_total_bytes=MAX_TOKEN_REFUSAL_BYTES)
        """Refused tokens' answers, held on a schedule per client address (a retry loop with a wrong token
        made as many refusals a second as it could send)."""

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
            await self._refused_token(handler_call_details, str(exc))
            return _rejecting(handler, str(exc), self._token_refusals)
        token = bearer(handler_call_details.invocation_metadata)
        return self._accepting(handler, tenant.name, token, handler_call_details.method)

    def _accepting(
        self, handler: grpc.RpcMethodHandler[Any, Any], tenant: str, token: str = "", method: str = "",
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """A streaming handler under its token's watch; a request-streaming one first takes a call slot, then
        says the call is accepted (controlplane.stream_accept): a refusal (quota) comes before the mark, so it
        reaches the client exactly."""
        if not handler.request_streaming and not handler.response_streaming:
            return handler
        if not handler.request_streaming:
            inner: Any = handler.unary_stream
            watched = self._guard.responses(inner, token, tenant, method)
            return grpc.unary_stream_rpc_method_handler(
                watched, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

        async def refused(reason: str) -> None:
            await self._record_refusal(tenant, method, "quota calls", reason)
            # A flood of refused calls is slowed where it comes from (controlplane.core.tenants.quota); held, the
            # stream's unread messages still sit in gRPC's window, counted at its worst case.
            await self._quotas.pause_refusal(tenant, HELD_STREAM_BYTES)

        return _streaming(
            handler, lambda: self._quotas.admit_call(tenant), refused, self._guard, token, tenant, method,
        )

    async def _refused_token(self, details: grpc.HandlerCallDetails, reason: str) -> None:
        """A call refused for its token is audited under the tenant the token was issued to (revoked or
        expired); a token no tenant holds names no one, and is not recorded (anyone can send one)."""
        if details.method not in AUDITED_CALLS:
            return
        try:
            holder = self._auth.directory.holder(bearer(details.invocation_metadata))
        except UnauthenticatedError:
            return
        if holder is not None:
            await self._record_refusal(holder, details.method, "authentication", reason)

    async def _record_refusal(self, tenant: str, method: str, rule: str, reason: str) -> None:
        kind, tool = AUDITED_CALLS.get(method, ("call", ""))
        await self._refusals.record(AuditEntry(
            tenant=tenant, session_id="", kind=kind, tool=tool, call_id="", outcome="denied", rule=rule,
            detail=reason,
        ))


def _streaming(
    handler: grpc.RpcMethodHandler[Any, Any], admit: Callable[[], Awaitable[Slot]],
    refused: Callable[[str], Awaitable[None]], guard: StreamGuard, token: str, tenant: str, method: str,
) -> grpc.RpcMethodHandler[Any, Any]:
    async def accept(context: grpc.aio.ServicerContext[Any, Any]) -> Callable[[], None]:
        try:
            slot = await admit()  # waits for the tenant's fair share of the calls (a waiting call reads nothing)
        except ControlPlaneError as exc:
            await refused(str(exc))
            await abort_with(context, exc)
            raise  # unreachable: abort raises
        try:
            await context.send_initial_metadata(ACCEPTED)
        except BaseException:
            slot.release()
            raise
        return slot.release

    inner: Any = handler.stream_stream if handler.response_streaming else handler.stream_unary
    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            guard.responses(inner, token, tenant, method, accept),
            request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer,
        )
    return grpc.stream_unary_rpc_method_handler(
        guard.unary_response(inner, token, tenant, method, accept),
        request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer,
    )


def peer_host(peer: str) -> str:
    """Where a call came from, as a client cannot multiply it: the address without its port
    (`ipv4:10.0.0.1:5000` -> `ipv4:10.0.0.1`; a client opens as many connections, and ports, as it likes), and
    for IPv6 the /64 it is in (one host is commonly given a whole /64, so its addresses are many)."""
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        return f"{kind}:{address.rpartition(':')[0]}"
    if kind == "ipv6":  # gRPC writes `ipv6:[::1]:5000`, or with the brackets percent-encoded
        host = urllib.parse.unquote(address).rpartition(":")[0].strip("[]").partition("%")[0]
        try:
            parsed = ipaddress.IPv6Address(host)
        except ValueError:
            return f"ipv6:{host}"
        if parsed.ipv4_mapped is not None:  # a dual-stack listener's IPv4 client: its own address, not ::/64
            return f"ipv4:{parsed.ipv4_mapped}"
        return f"ipv6:{ipaddress.IPv6Network((parsed, 64), strict=False)}"
    return peer


def _rejecting(
    handler: grpc.RpcMethodHandler[Any, Any], message: str, gate: RefusalGate,
) -> grpc.RpcMethodHandler[Any, Any]:
    """A refusal that never reads the request. Every kind of call gets a request-streaming handler: gRPC reads
    a unary call's message whole before its handler runs, so a refused CreateSession's archive was taken off the
    wire and parsed first (anyone reaching the port, with no token, grew the plane by GiB: 8 clients sending
    48 MiB archives, +2.9 GiB). Unread, a request stays in the client's window (HTTP/2's 64 KiB a stream, the
    server's BDP probing being off) and each refusal counts at that worst case."""

    async def held(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await gate.hold(peer_host(context.peer() or ""), HELD_STREAM_BYTES)

    async def reject(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await held(context)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def reject_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        # Interceptors that wrap streaming handlers (tracing) iterate them, so this must be a generator.
        await held(context)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - abort raises

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            reject_stream, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.stream_unary_rpc_method_handler(
        reject, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer,
    )
