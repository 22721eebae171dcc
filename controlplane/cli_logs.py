"""`controlplane logs SESSION`: what the session's custom tools and plugins print, for their authors.

Prints the lines the control plane still holds (recent ones, bounded per session), then follows the bus
until Ctrl-C, which ends it quietly. Lines of other event types are not shown.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from controlplane.client import AsyncClient


LOG_EVENT = "tool.log"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    logs = sub.add_parser("logs", parents=[common], help="print what a session's custom tools and plugins print "
                          "(recent lines, then live; Ctrl-C ends)")
    logs.add_argument("session")


CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}
"""Control characters are shown escaped: a tool's text must not drive the reader's terminal (escape
sequences that move the cursor, retitle the window, or hide lines)."""


def shown(value: object) -> str:
    return str(value).translate(CONTROL)


def line_text(properties: dict[str, Any]) -> str:
    """One log line for a person: time, level, file (and call), text."""
    at = datetime.fromtimestamp(float(properties.get("time") or 0)).strftime("%H:%M:%S.%f")[:-3]
    call = shown(properties.get("callID") or "load")
    level = shown(properties.get("level", "")).upper()
    return f"{at} {level:5} {shown(properties.get('origin', ''))} [{call}] {shown(properties.get('text', ''))}"


async def follow(client: AsyncClient, session_id: str, out: TextIO, as_json: bool = False) -> None:
    async for event in client.subscribe_events(session_id, recent_logs=True):
        if event.type != LOG_EVENT:
            continue
        properties = json.loads(event.properties_json or "{}")
        print(json.dumps(properties, ensure_ascii=False) if as_json else line_text(properties), file=out, flush=True)


async def run(args: argparse.Namespace) -> int:
    """Follows until Ctrl-C, which the command line reports as 130, quietly (controlplane.cli)."""
    from controlplane.cli_common import target_and_token
    from controlplane.client import AsyncClient  # here: `--help` and other commands do not load gRPC for it

    async with AsyncClient(*target_and_token(args)) as client:
        await follow(client, args.session, sys.stdout, args.json)
    return 0
