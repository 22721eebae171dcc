"""`controlplane snapshot list|delete`; `session snapshot SESSION` takes one and `session create --from-snapshot ID`
restores one (cli.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.v1 import session_pb2


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    snapshot = sub.add_parser("snapshot", help="this tenant's session snapshots")
    actions = snapshot.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", parents=[common], help="id, session, size, time and template")
    listing.add_argument("-q", "--quiet", action="store_true", help="print only the ids")
    delete = actions.add_parser("delete", parents=[common])
    delete.add_argument("snapshot")
    delete.add_argument("-q", "--quiet", action="store_true", help="print only the deleted snapshot's id")


def print_snapshots(snapshots: Sequence[session_pb2.Snapshot], args: argparse.Namespace) -> None:
    from controlplane.cli import as_dict

    if getattr(args, "quiet", False):
        print("\n".join(s.id for s in snapshots))
        return
    if args.json:
        print(json.dumps([as_dict(s) for s in snapshots], indent=2))
        return
    retained = any(s.retained for s in snapshots)
    rows = [("ID", "SESSION", "SIZE", "CREATED", "TEMPLATE", *(("PURGED AT",) if retained else ()))]
    for s in snapshots:
        created = datetime.fromtimestamp(s.created_at.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")
        # A retained snapshot (kept at its session's end) goes at its purge time; one taken stays until deleted.
        purge = datetime.fromtimestamp(s.purge_at.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S") if s.retained else ""
        rows.append((s.id, s.session_id, f"{s.size_bytes / (1 << 20):.1f} MiB", created, s.template,
                     *((purge,) if retained else ())))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


async def run(args: argparse.Namespace) -> int:
    from controlplane.cli_common import target_and_token
    from controlplane.client import AsyncClient  # here: `--help` and other commands do not load gRPC for it

    async with AsyncClient(*target_and_token(args)) as client:
        if args.action == "list":
            print_snapshots(await client.list_snapshots(), args)
        else:
            print_snapshots([await client.delete_snapshot(args.snapshot)], args)
    return 0
