"""`controlplane`: serve the platform, manage sessions, run commands in them.

    controlplane serve [--config FILE]
    controlplane session create|list|get|delete [...] [--json]
    controlplane exec SESSION [--cwd DIR] [--timeout-ms N] -- CMD [ARGS...]
    controlplane tools SESSION [--provider P] [--model M] [--agent A] [--json]
    controlplane tools reload SESSION [--json]
    controlplane tool SESSION TOOL ARGS_JSON [--agent A] [--yes]
    controlplane tenant create|list|usage|quota|rotate|revoke|delete [NAME] [...]   (with the admin token)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import sys
import tarfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from controlplane import app, cli_files, cli_logs, cli_tenants, discovery
from controlplane.client import AsyncClient, PermissionRequest
from controlplane.config import Settings, load_settings
from controlplane.errors import ControlPlaneError
from controlplane.v1 import session_pb2, tool_pb2
from sandbox_agent import event_loop

STATE_NAMES = {v: k for k, v in session_pb2.Session.State.items()}


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(Path(args.config) if args.config else None)


def _target_and_token(args: argparse.Namespace) -> tuple[str, str]:
    return discovery.find_endpoint(args.target, args.token, config=Path(args.config) if args.config else None)


def _ts(ts: Any) -> str:
    if not ts.seconds:
        return "-"
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(sessions: Sequence[session_pb2.Session]) -> str:
    rows = [("ID", "STATE", "AGENT", "SANDBOX", "CREATED (UTC)", "EXPIRES (UTC)", "MESSAGE")]
    for s in sessions:
        rows.append((s.id, STATE_NAMES[s.state], s.agent, s.sandbox_id, _ts(s.created_at), _ts(s.expires_at),
                     s.status_message))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _print_sessions(sessions: Sequence[session_pb2.Session], as_json: bool) -> None:
    if as_json:
        print(json.dumps([MessageToDict(s, preserving_proto_field_name=True) for s in sessions], indent=2))
    else:
        print(_table(sessions))


def _workspace_archive(path: str | None) -> bytes:
    if not path:
        return b""
    source = Path(path)
    if source.is_file():
        return source.read_bytes()
    if not source.is_dir():
        raise SystemExit(f"--workspace {path}: no such file or directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for entry in sorted(source.iterdir()):
            tar.add(entry, arcname=entry.name)
    return buf.getvalue()


def _create_inputs(args: argparse.Namespace) -> tuple[bytes, str]:
    if args.action != "create":
        return b"", ""
    config_json = Path(args.opencode_json).read_text() if args.opencode_json else ""
    return _workspace_archive(args.workspace), config_json


async def _session_cmd(args: argparse.Namespace, archive: bytes, config_json: str) -> int:
    target, token = _target_and_token(args)
    async with AsyncClient(target, token) as client:
        if args.action == "create":
            labels = dict(item.split("=", 1) for item in args.label)
            session = await client.create_session(
                agent=args.agent, workspace_archive=archive, labels=labels, config_json=config_json,
                cpu=args.cpu, memory_mb=args.memory_mb, pids=args.pids,
            )
            _print_sessions([session], args.json)
        elif args.action == "list":
            _print_sessions(await client.list_sessions(args.all), args.json)
        elif args.action == "get":
            _print_sessions([await client.get_session(args.session)], args.json)
        elif args.action == "delete":
            _print_sessions([await client.delete_session(args.session)], args.json)
    return 0


async def _exec_cmd(args: argparse.Namespace) -> int:
    target, token = _target_and_token(args)
    argv = args.argv
    if not argv:
        raise SystemExit("nothing to run: controlplane exec SESSION -- CMD [ARGS...]")
    async with AsyncClient(target, token) as client:
        async for event in client.exec(args.session, argv, cwd=args.cwd, timeout_ms=args.timeout_ms):
            kind = event.WhichOneof("event")
            if kind == "stdout":
                sys.stdout.buffer.write(event.stdout)
                sys.stdout.buffer.flush()
            elif kind == "stderr":
                sys.stderr.buffer.write(event.stderr)
                sys.stderr.buffer.flush()
            elif kind == "exited":
                if event.exited.timed_out:
                    print(f"controlplane: timed out after {event.exited.duration_ms} ms", file=sys.stderr)
                return event.exited.exit_code
    return 1


async def _tools_cmd(args: argparse.Namespace) -> int:
    target, token = _target_and_token(args)
    if args.session == "reload":  # no session id is "reload": they all start with ses_
        return await _reload_cmd(args, target, token)
    if args.reload_session:
        print("controlplane: tools takes one session (or: tools reload SESSION)", file=sys.stderr)
        return 2
    async with AsyncClient(target, token) as client:
        listing = await client.list_tools(
            args.session, provider_id=args.provider, model_id=args.model, agent=args.agent
        )
    if args.json:
        print(json.dumps(MessageToDict(listing, preserving_proto_field_name=True), indent=2))
        return 0
    for tool in listing.tools:
        summary = tool.description.splitlines()[0] if tool.description else ""
        print(f"{tool.id:<14} {summary[:100]}")
    for error in listing.load_errors:
        print(f"load error {error.origin}: {error.message}", file=sys.stderr)
    return 0


async def _reload_cmd(args: argparse.Namespace, target: str, token: str) -> int:
    if not args.reload_session:
        print("controlplane: tools reload needs a SESSION", file=sys.stderr)
        return 2
    async with AsyncClient(target, token) as client:
        report = await client.reload_tools(args.reload_session)
    if args.json:
        print(json.dumps(MessageToDict(report, preserving_proto_field_name=True), indent=2))
        return 0
    for label, items in (("tool added", report.added_tools), ("tool changed", report.changed_tools),
                         ("tool removed", report.removed_tools), ("file added", report.added_files),
                         ("file changed", report.changed_files), ("file removed", report.removed_files)):
        for item in items:
            print(f"{label:<13} {item}")
    for error in report.load_errors:
        print(f"load error {error.origin}: {error.message}", file=sys.stderr)
    return 0


async def _tool_cmd(args: argparse.Namespace) -> int:
    target, token = _target_and_token(args)

    async def answer(request: PermissionRequest) -> tuple[int, str]:
        patterns = ", ".join(request.patterns)
        if args.yes:
            return tool_pb2.PermissionReply.ONCE, ""
        reply = await asyncio.to_thread(input, f"allow {request.permission} ({patterns})? [y/N/a(lways)] ")
        choice = reply.strip().lower()
        if choice in ("a", "always"):
            return tool_pb2.PermissionReply.ALWAYS, ""
        if choice in ("y", "yes"):
            return tool_pb2.PermissionReply.ONCE, ""
        return tool_pb2.PermissionReply.REJECT, ""

    async with AsyncClient(target, token) as client:
        outcome = await client.execute_tool(args.session, args.tool, args.args_json, agent=args.agent,
                                            on_permission=answer)
    if outcome.result is None:
        print(outcome.error, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(MessageToDict(outcome.result, preserving_proto_field_name=True), indent=2))
    else:
        print(outcome.result.output)
    return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="operator TOML file (default: $CONTROLPLANE_CONFIG)")
    common.add_argument("--target", help="host:port of the control plane (default: the data dir's endpoint)")
    common.add_argument("--token", help="bearer token (default: $CONTROLPLANE_TOKEN or the default tenant's)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", parents=[common], help="run the control plane")
    serve.add_argument("--log-level", default="INFO")
    session = sub.add_parser("session", help="manage sessions")
    actions = session.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", parents=[common])
    create.add_argument("--agent", default="")
    create.add_argument("--workspace", help="a directory or a tar(.gz) to upload")
    create.add_argument("--opencode-json", help="an opencode.json for the project")
    create.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument("--cpu", type=float, default=0)
    create.add_argument("--memory-mb", type=int, default=0)
    create.add_argument("--pids", type=int, default=0)
    listing = actions.add_parser("list", parents=[common])
    listing.add_argument("--all", action="store_true", help="include deleted sessions")
    for name in ("get", "delete"):
        actions.add_parser(name, parents=[common]).add_argument("session")
    run = sub.add_parser("exec", parents=[common], help="run a command in a session's sandbox")
    run.add_argument("session")
    run.add_argument("--cwd", default="")
    run.add_argument("--timeout-ms", type=int, default=0)
    run.add_argument("argv", nargs="*", help="the command, after --")
    tools = sub.add_parser("tools", parents=[common], help="list a session's tools as a model sees them, or "
                           "`tools reload SESSION`: take the workspace's current custom tools, plugins and skills")
    tools.add_argument("session")
    tools.add_argument("reload_session", nargs="?", default="", metavar="SESSION",
                       help="with `reload`: the session whose tools to reload")
    tools.add_argument("--provider", default="")
    tools.add_argument("--model", default="")
    tools.add_argument("--agent", default="")
    tool = sub.add_parser("tool", parents=[common], help="call one tool in a session")
    tool.add_argument("session")
    tool.add_argument("tool")
    tool.add_argument("args_json", help='the arguments as a JSON object, e.g. \'{"filePath": "a.txt"}\'')
    tool.add_argument("--agent", default="")
    tool.add_argument("--yes", action="store_true", help="allow every permission request once")
    cli_tenants.add_parser(sub, common)
    cli_files.add_parser(sub, common)
    cli_logs.add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` is the command of `exec`, never options of ours.
    command: list[str] | None = None
    if "--" in words:
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1 :]
    args = _parser().parse_args(words)
    if command is not None:
        args.argv = [*getattr(args, "argv", []), *command]
    try:
        if args.command == "serve":
            logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            event_loop.run(app.serve(_settings(args)))
            return 0
        if args.command == "session":
            return asyncio.run(_session_cmd(args, *_create_inputs(args)))
        if args.command == "tools":
            return asyncio.run(_tools_cmd(args))
        if args.command == "tool":
            return asyncio.run(_tool_cmd(args))
        if args.command == "tenant":
            return asyncio.run(cli_tenants.run(args))
        if args.command == "cp":
            return asyncio.run(cli_files.run(args, _target_and_token))
        if args.command == "logs":
            return cli_logs.main(args, _target_and_token)
        return asyncio.run(_exec_cmd(args))
    except grpc.aio.AioRpcError as exc:
        print(f"controlplane: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    except ControlPlaneError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
