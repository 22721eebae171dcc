"""`controlplane template list`: the templates this tenant may name in `session create --template`."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    template = sub.add_parser("template", help="the sandbox templates this tenant may use")
    actions = template.add_subparsers(dest="action", required=True)
    actions.add_parser("list", parents=[common], help="name, image, state (building, ready, failed) and pool size")


async def run(args: argparse.Namespace) -> int:
    from controlplane.cli import as_dict
    from controlplane.cli_common import target_and_token
    from controlplane.client import AsyncClient  # here: `--help` and other commands do not load gRPC for it
    from controlplane.v1 import session_pb2

    async with AsyncClient(*target_and_token(args)) as client:
        templates = await client.list_templates()
    if args.json:
        print(json.dumps([as_dict(t) for t in templates], indent=2))
        return 0
    rows = [("NAME", "STATE", "POOL", "IMAGE")]
    rows += [(t.name, session_pb2.Template.State.Name(t.state), str(t.pool_size), t.image) for t in templates]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[3])
    for t in templates:
        if t.error:
            print(f"{t.name}: {t.error}")
    return 0
