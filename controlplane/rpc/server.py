"""Builds the public gRPC server: services, auth, health and reflection."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controlplane.config import Settings
from controlplane.core.calls.tool_runtime import ToolRuntime
from controlplane.core.permissions.exec_policy import ExecGate
from controlplane.core.sessions.manager import SessionManager
from controlplane.core.sessions.pausing import SessionPauses
from controlplane.core.sessions.recent_logs import RecentLogs
from controlplane.core.sessions.snapshotting import SessionSnapshots
from controlplane.core.sessions.workspace_spool import WorkspaceSpool
from controlplane.core.tenants.lifecycle import TenantAdmin
from controlplane.core.tenants.quota import TenantQuotas
from controlplane.rpc.admin_service import AdminService
from controlplane.rpc.audit_service import AuditService
from controlplane.rpc.auth import Authenticator, AuthInterceptor
from controlplane.rpc.event_service import EventService
from controlplane.rpc.file_service import FileService
from controlplane.rpc.permission_service import PermissionService
from controlplane.rpc.question_service import QuestionService
from controlplane.rpc.sandbox_service import SandboxService
from controlplane.rpc.session_service import SessionService
from controlplane.rpc.tool_service import ToolService
from controlplane.snapshots.fs_store import FsSnapshotStorage
from controlplane.store.base import AuditWriter, Store
from controlplane.telemetry.grpc_server import server_interceptors
from controlplane.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    event_pb2,
    event_pb2_grpc,
    file_pb2,
    file_pb2_grpc,
    permission_pb2,
    permission_pb2_grpc,
    question_pb2,
    question_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
)

SERVICES = (
    session_pb2.DESCRIPTOR.services_by_name["SessionService"],
    sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"],
    tool_pb2.DESCRIPTOR.services_by_name["ToolService"],
    permission_pb2.DESCRIPTOR.services_by_name["PermissionService"],
    question_pb2.DESCRIPTOR.services_by_name["QuestionService"],
    event_pb2.DESCRIPTOR.services_by_name["EventService"],
    file_pb2.DESCRIPTOR.services_by_name["FileService"],
    audit_pb2.DESCRIPTOR.services_by_name["AuditService"],
)
SERVICE_NAMES = tuple(service.full_name for service in SERVICES)
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
"""Served beside SERVICES, under the admin token instead of a tenant's."""


MAX_METADATA_BYTES = 256 * 1024
"""A request's headers, all together: gRPC's default (8 KiB soft, 16 KiB hard) answered a long wrong token
RESOURCE_EXHAUSTED before authentication could say UNAUTHENTICATED. Raised so that any token up to far past
MAX_TOKEN_BYTES reaches the authenticator; past this, the transport refuses the request itself."""
METADATA_OPTIONS = (("grpc.max_metadata_size", MAX_METADATA_BYTES),
                    ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES))


RECEIVE_WINDOW_OPTIONS = (("grpc.http2.bdp_probe", 0),)
"""Each request stream's receive window stays at HTTP/2's 64 KiB instead of growing with gRPC's bandwidth-delay
probing: grown, a stream whose messages the plane does not read (a refusal held on its schedule, controlplane.
core.tenants.refusals) still had its client's whole 8 MiB message taken into gRPC's buffers, 2.4 GiB for 200 of
them. A message the plane reads is unaffected (gRPC opens the window to the size of the message being read);
a 100 MiB upload over loopback measured 0.79 s with probing and 0.83 s without (alternating runs)."""


def build_server(
    settings: Settings, sessions: SessionManager, tools: ToolRuntime, auth: Authenticator,
    tenants: TenantAdmin | None = None, exec_gate: ExecGate | None = None,
    audit: tuple[Store, AuditWriter] | None = None,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, int]:
    """The server (not started), its health servicer and the bound port; AdminService only with `tenants`."""
    quotas = tenants.quotas if tenants is not None else TenantQuotas.unlimited()
    limit = settings.server.max_message_mb * 1024 * 1024
    server = grpc.aio.server(
        interceptors=[*server_interceptors(), AuthInterceptor(auth, quotas, exec_gate.audit if exec_gate else None)],
        options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                 *METADATA_OPTIONS, *RECEIVE_WINDOW_OPTIONS],
    )
    snapshots = None if audit is None else SessionSnapshots(
        sessions, FsSnapshotStorage(settings.snapshots.root(settings.data_dir)), audit[0], audit[0], quotas,
        settings.snapshots.max_per_tenant,
        WorkspaceSpool(settings.snapshots.spool(settings.data_dir, settings.instance),
                       settings.snapshots.max_concurrent_copies))
    pauses = None if snapshots is None or audit is None else pausing(settings, sessions, snapshots, audit[0])
    session_pb2_grpc.add_SessionServiceServicer_to_server(
        SessionService(sessions, auth, quotas, snapshots, pauses), server)
    sandbox = SandboxService(sessions, auth, settings.exec, exec_gate)
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(sandbox, server)
    tool_pb2_grpc.add_ToolServiceServicer_to_server(ToolService(tools, auth), server)
    permission_pb2_grpc.add_PermissionServiceServicer_to_server(PermissionService(tools, auth), server)
    question_pb2_grpc.add_QuestionServiceServicer_to_server(QuestionService(tools, auth), server)
    event_pb2_grpc.add_EventServiceServicer_to_server(
        EventService(sessions, tools.bus, auth, quotas, RecentLogs(tools.bus)), server)
    files = FileService(sessions, auth, exec_gate.audit if exec_gate is not None else None)
    file_pb2_grpc.add_FileServiceServicer_to_server(files, server)
    if audit is not None:
        audit_pb2_grpc.add_AuditServiceServicer_to_server(AuditService(*audit, sessions, auth), server)
    if tenants is not None:
        admin_pb2_grpc.add_AdminServiceServicer_to_server(AdminService(tenants), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, ADMIN_SERVICE.full_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    tls = settings.server
    if tls.tls_cert and tls.tls_key:
        credentials = grpc.ssl_server_credentials([(tls.tls_key.read_bytes(), tls.tls_cert.read_bytes())])
        port = server.add_secure_port(settings.server.listen, credentials)
    else:
        port = server.add_insecure_port(settings.server.listen)
    return server, health_servicer, port


def pausing(settings: Settings, sessions: SessionManager, snapshots: SessionSnapshots, store: Store) -> SessionPauses:
    lifetime = settings.lifetime
    return SessionPauses(sessions, snapshots, snapshots.storage, store, lifetime.pause_after_idle_s, lifetime.retain_s,
                         settings.snapshots.max_per_tenant, max_paused_s=lifetime.max_paused_s,
                         instance=settings.instance)


async def mark_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, status)
