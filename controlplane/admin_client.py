"""A typed client for AdminService: `AsyncAdminClient`, and `AdminClient` for synchronous callers.

It authenticates with the admin token (the data dir's `admin.token`), not a tenant's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import grpc

from controlplane.client import sendable_token
from controlplane.v1 import admin_pb2, admin_pb2_grpc

T = TypeVar("T")
Tenant = admin_pb2.Tenant
TenantToken = admin_pb2.TenantToken
Usage = admin_pb2.Usage


def quota(**limits: float | None) -> admin_pb2.Quota:
    """A Quota message from keyword limits (sessions, cpu, memory_mb, disk_mb, calls, subscriptions);
    None leaves a key unset, -1 lifts a configured limit."""
    given: dict[str, Any] = {k: (v if k == "cpu" else int(v)) for k, v in limits.items() if v is not None}
    return admin_pb2.Quota(**given)


class AsyncAdminClient:
    def __init__(self, target: str, admin_token: str, *, root_certificates: bytes | None = None) -> None:
        sendable_token(admin_token)
        if root_certificates is not None:
            self._channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates))
        else:
            self._channel = grpc.aio.insecure_channel(target)
        self._metadata = (("authorization", f"Bearer {admin_token}"),)
        self.admin = admin_pb2_grpc.AdminServiceStub(self._channel)

    async def __aenter__(self) -> AsyncAdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def create_tenant(
        self, name: str, *, ttl_s: float = 0, quota: admin_pb2.Quota | None = None,
    ) -> admin_pb2.TenantToken:
        """The new tenant and its token (shown this once)."""
        request = admin_pb2.CreateTenantRequest(name=name, ttl_s=ttl_s)
        if quota is not None:
            request.quota.CopyFrom(quota)
        return await self.admin.CreateTenant(request, metadata=self._metadata)

    async def list_tenants(self) -> list[admin_pb2.Tenant]:
        reply = await self.admin.ListTenants(admin_pb2.ListTenantsRequest(), metadata=self._metadata)
        return list(reply.tenants)

    async def usage(self, name: str) -> admin_pb2.Usage:
        return await self.admin.GetUsage(admin_pb2.GetUsageRequest(name=name), metadata=self._metadata)

    async def set_quota(self, name: str, quota: admin_pb2.Quota) -> admin_pb2.Tenant:
        request = admin_pb2.SetQuotaRequest(name=name, quota=quota)
        return await self.admin.SetQuota(request, metadata=self._metadata)

    async def rotate_token(self, name: str, *, ttl_s: float = 0) -> admin_pb2.TenantToken:
        request = admin_pb2.RotateTokenRequest(name=name, ttl_s=ttl_s)
        return await self.admin.RotateToken(request, metadata=self._metadata)

    async def revoke_token(self, name: str) -> admin_pb2.Tenant:
        return await self.admin.RevokeToken(admin_pb2.RevokeTokenRequest(name=name), metadata=self._metadata)

    async def delete_tenant(self, name: str) -> admin_pb2.DeleteTenantResponse:
        return await self.admin.DeleteTenant(admin_pb2.DeleteTenantRequest(name=name), metadata=self._metadata)


class AdminClient:
    """Synchronous wrapper: the async client driven on a private event-loop thread."""

    def __init__(self, target: str, admin_token: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="controlplane-admin", daemon=True)
        self._thread.start()
        self._async = self._call(_make(target, admin_token, kwargs))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def create_tenant(self, name: str, **kwargs: Any) -> admin_pb2.TenantToken:
        return self._call(self._async.create_tenant(name, **kwargs))

    def list_tenants(self) -> list[admin_pb2.Tenant]:
        return self._call(self._async.list_tenants())

    def usage(self, name: str) -> admin_pb2.Usage:
        return self._call(self._async.usage(name))

    def set_quota(self, name: str, quota: admin_pb2.Quota) -> admin_pb2.Tenant:
        return self._call(self._async.set_quota(name, quota))

    def rotate_token(self, name: str, **kwargs: Any) -> admin_pb2.TenantToken:
        return self._call(self._async.rotate_token(name, **kwargs))

    def revoke_token(self, name: str) -> admin_pb2.Tenant:
        return self._call(self._async.revoke_token(name))

    def delete_tenant(self, name: str) -> admin_pb2.DeleteTenantResponse:
        return self._call(self._async.delete_tenant(name))

    def close(self) -> None:
        self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(target: str, admin_token: str, kwargs: dict[str, Any]) -> AsyncAdminClient:
    return AsyncAdminClient(target, admin_token, **kwargs)
