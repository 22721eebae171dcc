"""`controlplane tenant create|list|usage|quota|rotate|revoke|delete`: the operator's tenant lifecycle
over AdminService, with the admin token (--token, $CONTROLPLANE_ADMIN_TOKEN or the data dir's admin.token)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from controlplane.cli_common import admin_target_and_token
from controlplane.core.tenants.quota import KEYS

if TYPE_CHECKING:
    from controlplane.v1 import admin_pb2

ACTIONS = ("create", "list", "usage", "quota", "rotate", "revoke", "delete")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    tenant = sub.add_parser("tenant", help="manage tenants (with the admin token)")
    actions = tenant.add_subparsers(dest="action", required=True)
    for name in ACTIONS:
        action = actions.add_parser(name, parents=[common])
        if name != "list":
            action.add_argument("name")
        if name in ("create", "rotate"):
            action.add_argument("--ttl-s", type=float, default=0, help="seconds the token stays valid (0: no expiry)")
        if name in ("create", "quota"):
            for key in KEYS:
                action.add_argument(f"--{key.replace('_', '-')}", type=float if key == "cpu" else int, default=None,
                                    help="-1 lifts the configured limit" if name == "quota" else None)


def _target_and_admin_token(args: argparse.Namespace) -> tuple[str, str]:
    return admin_target_and_token(args)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _limits(q: admin_pb2.Quota) -> str:
    set_ = [f"{k}={getattr(q, k):g}" for k in KEYS if q.HasField(k)]  # type: ignore[arg-type]
    return " ".join(set_) or "unlimited"


def _print(message: Any, as_json: bool) -> None:
    from google.protobuf.json_format import MessageToDict

    from controlplane.v1 import admin_pb2

    if as_json:
        print(json.dumps(MessageToDict(message, preserving_proto_field_name=True), indent=2))
        return
    if isinstance(message, admin_pb2.TenantToken):
        _print(message.tenant, False)
        print(f"token: {message.token}")
    elif isinstance(message, admin_pb2.Tenant):
        state = "revoked" if message.revoked_at else "active"
        print(f"{message.name:<20} {message.origin:<8} {state:<8} expires {_when(message.expires_at):<19} "
              f"quota {_limits(message.quota)}")
    elif isinstance(message, admin_pb2.Usage):
        print(f"tenant {message.tenant}: {message.sessions} sessions, {message.cpu:g} CPUs, {message.memory_mb} MiB "
              f"memory, {message.disk_mb} MiB disk reserved; {message.calls} calls running "
              f"({message.calls_started} started), {message.subscriptions} subscriptions; "
              f"quota {_limits(message.quota)}")
    elif isinstance(message, admin_pb2.DeleteTenantResponse):
        _print(message.tenant, False)
        print(f"deleted {len(message.session_ids)} sessions: {' '.join(message.session_ids) or '-'}")


async def run(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from controlplane.admin_client import AsyncAdminClient, quota

    address, token = _target_and_admin_token(args)
    limits = {k: getattr(args, k, None) for k in KEYS}
    async with AsyncAdminClient(address, token) as client:
        if args.action == "list":
            tenants = await client.list_tenants()
            if args.json:
                print(json.dumps([MessageToDict(t, preserving_proto_field_name=True) for t in tenants], indent=2))
            for t in [] if args.json else tenants:
                _print(t, False)
            return 0
        reply: Any
        if args.action == "create":
            given = {k: v for k, v in limits.items() if v is not None}
            reply = await client.create_tenant(args.name, ttl_s=args.ttl_s, quota=quota(**given) if given else None)
        elif args.action == "usage":
            reply = await client.usage(args.name)
        elif args.action == "quota":
            reply = await client.set_quota(args.name, quota(**limits))
        elif args.action == "rotate":
            reply = await client.rotate_token(args.name, ttl_s=args.ttl_s)
        elif args.action == "revoke":
            reply = await client.revoke_token(args.name)
        else:
            reply = await client.delete_tenant(args.name)
        _print(reply, args.json)
    if args.action in ("create", "rotate") and not args.json:
        print("store the token now: only its hash is kept", file=sys.stderr)
    return 0
