"""controlplane.v1.AdminService: the operator's tenant lifecycle (the admin token is checked by rpc/auth.py)."""

from __future__ import annotations

from typing import Any

from controlplane.core.tenants.lifecycle import TenantAdmin
from controlplane.core.tenants.quota import KEYS, Quota, Usage
from controlplane.core.tenants.records import TenantRecord
from controlplane.errors import InvalidArgumentError
from controlplane.rpc.errors import unary
from controlplane.v1 import admin_pb2, admin_pb2_grpc


def quota_to_proto(quota: Quota) -> admin_pb2.Quota:
    return admin_pb2.Quota(**quota.to_dict())


def quota_of(message: admin_pb2.Quota) -> Quota:
    try:
        return Quota.from_dict({k: getattr(message, k) for k in KEYS if message.HasField(k)})  # type: ignore[arg-type]
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


def usage_to_proto(tenant: str, usage: Usage, quota: Quota) -> admin_pb2.Usage:
    return admin_pb2.Usage(
        tenant=tenant, sessions=usage.sessions, cpu=usage.cpu, memory_mb=usage.memory_mb, disk_mb=usage.disk_mb,
        calls=usage.calls, calls_started=usage.calls_started, subscriptions=usage.subscriptions,
        cpu_seconds=usage.cpu_seconds, egress_bytes=usage.egress_bytes,
        quota=quota_to_proto(quota),
    )


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, tenants: TenantAdmin) -> None:
        self._tenants = tenants

    def _proto(self, record: TenantRecord) -> admin_pb2.Tenant:
        return admin_pb2.Tenant(
            name=record.name, origin=record.origin, created_at=record.created_at,
            expires_at=record.expires_at or 0.0, revoked_at=record.revoked_at or 0.0,
            quota=quota_to_proto(self._tenants.quotas.quota(record.name)),
        )

    @unary
    async def CreateTenant(self, request: admin_pb2.CreateTenantRequest, context: Any) -> admin_pb2.TenantToken:
        quota = quota_of(request.quota) if request.HasField("quota") else None
        record, token = await self._tenants.create(request.name, request.ttl_s, quota)
        return admin_pb2.TenantToken(tenant=self._proto(record), token=token)

    @unary
    async def ListTenants(self, request: admin_pb2.ListTenantsRequest, context: Any) -> admin_pb2.ListTenantsResponse:
        return admin_pb2.ListTenantsResponse(tenants=[self._proto(r) for r in await self._tenants.list_tenants()])

    @unary
    async def GetUsage(self, request: admin_pb2.GetUsageRequest, context: Any) -> admin_pb2.Usage:
        usage = await self._tenants.usage(request.name)
        return usage_to_proto(request.name, usage, self._tenants.quotas.quota(request.name))

    @unary
    async def SetQuota(self, request: admin_pb2.SetQuotaRequest, context: Any) -> admin_pb2.Tenant:
        return self._proto(await self._tenants.set_quota(request.name, quota_of(request.quota)))

    @unary
    async def RotateToken(self, request: admin_pb2.RotateTokenRequest, context: Any) -> admin_pb2.TenantToken:
        record, token = await self._tenants.rotate(request.name, request.ttl_s)
        return admin_pb2.TenantToken(tenant=self._proto(record), token=token)

    @unary
    async def RevokeToken(self, request: admin_pb2.RevokeTokenRequest, context: Any) -> admin_pb2.Tenant:
        return self._proto(await self._tenants.revoke(request.name))

    @unary
    async def DeleteTenant(
        self, request: admin_pb2.DeleteTenantRequest, context: Any
    ) -> admin_pb2.DeleteTenantResponse:
        record, deleted = await self._tenants.delete(request.name)
        return admin_pb2.DeleteTenantResponse(tenant=self._proto(record), session_ids=deleted)
