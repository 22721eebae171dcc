"""`controlplane tool`, `events`, `approvals`, `audit` and `mcp`: the commands about calls and their answers.

`tool` writes the call's live output (metadata deltas) to stderr as it comes and the result to stdout,
so `$(controlplane tool ...)` captures only the result; a tool error exits 1. A permission ask is put to
the person at the terminal; with no terminal it is rejected (a script cannot answer it, and waiting
would hang it), with a message saying how to allow it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from typing import TYPE_CHECKING, Any

from controlplane.cli_common import rerouted, target_and_token

if TYPE_CHECKING:
    from controlplane.v1 import tool_pb2

REPLIES = ("once", "always", "reject")
NO_TERMINAL = ("no terminal to ask: rejected. Pass --yes to allow every ask once, answer from another shell "
               "(`controlplane approvals reply REQUEST_ID once`) while a terminal waits, or allow it by a rule")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    tool = sub.add_parser("tool", parents=[common], help="call one tool in a session (streams its live output)")
    tool.add_argument("session")
    tool.add_argument("tool")
    tool.add_argument("args_json", help='the arguments as a JSON object, e.g. \'{"filePath": "a.txt"}\'')
    tool.add_argument("--agent", default="")
    tool.add_argument("--yes", action="store_true", help="allow every permission request once")
    events = sub.add_parser("events", parents=[common], help="follow the bus (of one session when given)")
    events.add_argument("session", nargs="?", default="")
    approvals = sub.add_parser("approvals", help="permission asks waiting for a reply")
    actions = approvals.add_subparsers(dest="action", required=True)
    actions.add_parser("list", parents=[common]).add_argument("session", nargs="?", default="")
    reply = actions.add_parser("reply", parents=[common])
    reply.add_argument("request_id")
    reply.add_argument("reply", choices=REPLIES)
    reply.add_argument("--message", default="", help="with reject: feedback the model reads")
    audit = sub.add_parser("audit", parents=[common], help="the tenant's audit record (of one session when given)")
    audit.add_argument("session", nargs="?", default="")
    audit.add_argument("--limit", type=int, default=0, help="only the newest N entries")
    mcp = sub.add_parser("mcp", parents=[common], help="serve a session's tools to an MCP client on stdio")
    mcp.add_argument("session")


async def run(args: argparse.Namespace) -> int:
    if args.command == "tool":
        return await _tool(args)
    if args.command == "events":
        return await _events(args)
    if args.command == "approvals":
        return await _approvals(args)
    if args.command == "audit":
        return await _audit(args)
    from controlplane.mcp_front.stdio import serve_stdio

    target, token = target_and_token(args)
    return await serve_stdio(target, token, args.session)


async def _tool(args: argparse.Namespace) -> int:
    from controlplane.client import AsyncClient
    from controlplane.v1 import tool_pb2

    try:
        parsed = json.loads(args.args_json)
    except json.JSONDecodeError as exc:
        print(f"controlplane: ARGS_JSON is not JSON ({exc}): pass an object, e.g. '{{\"filePath\": \"a.txt\"}}'",
              file=sys.stderr)
        return 2
    if not isinstance(parsed, dict):
        print("controlplane: ARGS_JSON must be a JSON object", file=sys.stderr)
        return 2
    target, token = target_and_token(args)
    async with AsyncClient(target, token) as client:
        stream, outbox = client.tool_call(args.session, args.tool, parsed, agent=args.agent)
        live = _Live()
        top = ""
        finished = False
        try:
            async for event in stream:
                top = top or event.call_id
                kind = event.WhichOneof("event")
                if kind == "metadata":
                    live.show(event.metadata)
                elif kind == "permission_request":
                    reply, message = await _answer(event.permission_request, args.yes)
                    answer = tool_pb2.PermissionReply(request_id=event.permission_request.id, reply=reply,  # type: ignore[arg-type]
                                                      message=message)
                    outbox.put_nowait(tool_pb2.ExecuteToolRequest(permission_reply=answer))
                elif kind in ("result", "error") and event.call_id != top:
                    continue  # a batch entry's end, not the call's
                elif kind == "result":
                    finished = True
                    live.end()
                    if rerouted(event.result):  # an unknown tool: upstream's `invalid` answered
                        print(event.result.output, file=sys.stderr)
                        return 1
                    if args.json:
                        from controlplane.cli import as_dict

                        print(json.dumps(as_dict(event.result), indent=2))
                    else:
                        print(event.result.output)
                    return 0
                elif kind == "error":
                    finished = True
                    live.end()
                    print(event.error.message, file=sys.stderr)
                    return 1
        finally:
            outbox.put_nowait(None)
            if not finished:
                stream.cancel()  # Ctrl-C (or a broken stream): cancelling the RPC aborts the call
    print("controlplane: the call's stream ended without a result", file=sys.stderr)
    return 1


class _Live:
    """Writes what a call's metadata adds to its `output` (bash's live output) to stderr."""

    def __init__(self) -> None:
        self.shown = ""

    def show(self, metadata: tool_pb2.ToolMetadata) -> None:
        try:
            output = json.loads(metadata.metadata_json or "{}").get("output")
        except (json.JSONDecodeError, AttributeError):
            return
        if not isinstance(output, str):
            return
        # The output is cumulative (and may be re-truncated): write only the new part, or all of it anew.
        delta = output[len(self.shown):] if output.startswith(self.shown) else "\n" + output
        self.shown = output
        sys.stderr.write(delta)
        sys.stderr.flush()

    def end(self) -> None:
        if self.shown and not self.shown.endswith("\n"):
            sys.stderr.write("\n")


async def _answer(request: tool_pb2.PermissionRequest, yes: bool) -> tuple[int, str]:
    from controlplane.v1 import tool_pb2

    if yes:
        return tool_pb2.PermissionReply.ONCE, ""
    patterns = ", ".join(request.patterns)
    if not sys.stdin.isatty():
        print(f"controlplane: permission {request.permission} ({patterns}) [{request.id}]: {NO_TERMINAL}",
              file=sys.stderr)
        return tool_pb2.PermissionReply.REJECT, "rejected: no one at a terminal to ask"
    reply = await _prompt(f"allow {request.permission} ({patterns})? [y/N/a(lways)] ")
    choice = (reply or "").strip().lower()
    if choice in ("a", "always"):
        return tool_pb2.PermissionReply.ALWAYS, ""
    if choice in ("y", "yes"):
        return tool_pb2.PermissionReply.ONCE, ""
    return tool_pb2.PermissionReply.REJECT, ""


async def _prompt(text: str) -> str | None:
    """A line read on a daemon thread: Ctrl-C must not wait for it (asyncio.run's executor would join it);
    None at end of input."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str | None] = loop.create_future()

    def read() -> None:
        # The question goes to stderr: stdout carries only the call's result.
        sys.stderr.write(text)
        sys.stderr.flush()
        try:
            line: str | None = sys.stdin.readline() or None  # "" is the end of input
        except OSError:
            line = None
        loop.call_soon_threadsafe(_settle, answer, line)

    threading.Thread(target=read, name="permission-prompt", daemon=True).start()
    return await answer


def _settle(answer: asyncio.Future[str | None], line: str | None) -> None:
    if not answer.done():  # cancelled by Ctrl-C meanwhile
        answer.set_result(line)


async def _events(args: argparse.Namespace) -> int:
    from controlplane.client import AsyncClient

    target, token = target_and_token(args)
    async with AsyncClient(target, token) as client:
        async for event in client.subscribe_events(args.session):
            properties = json.loads(event.properties_json or "{}")
            if args.json:
                print(json.dumps({"type": event.type, "session_id": event.session_id, "time": event.time,
                                  "properties": properties}), flush=True)
            else:
                print(f"{event.time:.3f} {event.type:<20} {event.session_id or '-'} "
                      f"{json.dumps(properties)[:200]}", flush=True)
    return 0


async def _approvals(args: argparse.Namespace) -> int:
    from controlplane.client import AsyncClient

    target, token = target_and_token(args)
    async with AsyncClient(target, token) as client:
        if args.action == "reply":
            await client.reply_permission(args.request_id, args.reply, args.message)
            return 0
        pending = await client.pending_permissions(args.session)
    if args.json:
        from controlplane.cli import as_dict

        print(json.dumps([as_dict(p) for p in pending], indent=2))
        return 0
    for p in pending:
        print(f"{p.request.id}  {p.session_id}  {p.request.permission:<12} {', '.join(p.request.patterns)}")
    return 0


async def _audit(args: argparse.Namespace) -> int:
    import grpc

    from controlplane.v1 import audit_pb2, audit_pb2_grpc

    target, token = target_and_token(args)
    # The client SDK has no audit call: this one command speaks to AuditService directly.
    async with grpc.aio.insecure_channel(target) as channel:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        request = audit_pb2.ListAuditRequest(session_id=args.session, limit=max(args.limit, 0))
        response = await stub.ListAudit(request, metadata=(("authorization", f"Bearer {token}"),))
    if args.json:
        from controlplane.cli import as_dict

        print(json.dumps([as_dict(e) for e in response.entries], indent=2))
        return 0
    from datetime import UTC, datetime

    for e in response.entries:
        when = datetime.fromtimestamp(e.time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        what = f"{e.permission} {', '.join(e.patterns)}" if e.kind == "permission" else e.detail[:80]
        print(f"{when}  {e.session_id}  {e.kind:<10} {e.tool:<10} {e.outcome:<9} {what}  {e.rule}".rstrip())
    return 0
