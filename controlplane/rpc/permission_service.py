"""controlplane.v1.PermissionService: pending requests answered from any connection."""

from __future__ import annotations

from typing import Any

from controlplane.core.calls.tool_runtime import ToolRuntime
from controlplane.errors import InvalidArgumentError
from controlplane.rpc.auth import Authenticator
from controlplane.rpc.errors import unary
from controlplane.rpc.tool_service import permission_request, reply_of
from controlplane.v1 import permission_pb2, permission_pb2_grpc


class PermissionService(permission_pb2_grpc.PermissionServiceServicer):
    def __init__(self, runtime: ToolRuntime, auth: Authenticator) -> None:
        self._runtime = runtime
        self._auth = auth

    @unary
    async def ListPendingPermissions(
        self, request: permission_pb2.ListPendingPermissionsRequest, context: Any
    ) -> permission_pb2.ListPendingPermissionsResponse:
        tenant = self._auth.tenant_of(context)
        if not request.session_id:
            raise InvalidArgumentError("session_id is required")
        pending = await self._runtime.pending_permissions(tenant.name, request.session_id)
        return permission_pb2.ListPendingPermissionsResponse(requests=[
            permission_pb2.PendingPermission(
                request=permission_request(r), session_id=r.session_id, call_id=r.call_id, message_id=r.message_id,
            )
            for r in pending
        ])

    @unary
    async def ReplyPermission(
        self, request: permission_pb2.ReplyPermissionRequest, context: Any
    ) -> permission_pb2.ReplyPermissionResponse:
        tenant = self._auth.tenant_of(context)
        if not request.request_id:
            raise InvalidArgumentError("request_id is required")
        await self._runtime.reply_permission(tenant.name, request.request_id, reply_of(request.reply), request.message)
        return permission_pb2.ReplyPermissionResponse()
