"""`controlplane`: serve the platform, manage sessions, run commands and tools in them.

    controlplane serve [--config FILE]
    controlplane session create|list|get|delete [...] [-q]    (create --template NAME: a template's image)
    controlplane template list
    controlplane exec SESSION [--cwd DIR] [--timeout-ms N] -- CMD [ARGS...]
    controlplane tools SESSION [--provider P] [--model M] [--agent A]
    controlplane tools reload SESSION
    controlplane tool SESSION TOOL ARGS_JSON [--agent A] [--yes]
    controlplane events [SESSION]                      (follows the bus until Ctrl-C)
    controlplane approvals list [SESSION] | reply REQUEST_ID once|always|reject [--message M]
    controlplane audit [SESSION] [--limit N]
    controlplane mcp SESSION                           (an MCP server on stdio: the session's tools)
    controlplane tenant create|list|usage|quota|rotate|revoke|delete [NAME] [...]   (with the admin token)

`--json` (anywhere on the line) prints JSON. Exit status: 0 done, 1 the tool or command failed, 2 bad
input or a refused request, 130 interrupted (Ctrl-C aborts a running call).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.cli_common import target_and_token

if TYPE_CHECKING:
    from controlplane.v1 import session_pb2

COMMAND_MODULES = (
    "controlplane.cli_calls", "controlplane.cli_tenants", "controlplane.cli_files", "controlplane.cli_logs",
    "controlplane.cli_templates", "controlplane.cli_snapshots",
)
"""Modules adding commands: each has `add_parser(sub, common)` and `run(args) -> int` (a coroutine), and
dispatches on `args.command`; they import what their commands need when those run, not at parse time."""
INTERRUPTED = 130
"""128 + SIGINT, as a shell reports a command stopped by Ctrl-C."""


def _ts(ts: Any) -> str:
    if not ts.seconds:
        return "-"
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(sessions: Sequence[session_pb2.Session]) -> str:
    from controlplane.v1 import session_pb2

    state_names = {v: k for k, v in session_pb2.Session.State.items()}
    rows = [("ID", "STATE", "AGENT", "SANDBOX", "CREATED (UTC)", "EXPIRES (UTC)", "MESSAGE")]
    for s in sessions:
        rows.append((s.id, state_names[s.state], s.agent, s.sandbox_id, _ts(s.created_at), _ts(s.expires_at),
                     s.status_message))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def as_dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    found: dict[str, Any] = MessageToDict(message, preserving_proto_field_name=True)
    return found


def _print_sessions(sessions: Sequence[session_pb2.Session], args: argparse.Namespace) -> None:
    if getattr(args, "quiet", False):
        print("\n".join(s.id for s in sessions))
    elif args.json:
        print(json.dumps([as_dict(s) for s in sessions], indent=2))
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
    from controlplane.workspace_dir import archive_directory  # the SDK's archiver: bounded, no link out

    return archive_directory(source)


def _create_inputs(args: argparse.Namespace) -> tuple[bytes, str]:
    if args.action != "create":
        return b"", ""
    config_json = Path(args.opencode_json).read_text() if args.opencode_json else ""
    return _workspace_archive(args.workspace), config_json


async def _session_cmd(args: argparse.Namespace, archive: bytes, config_json: str) -> int:
    from controlplane.client import AsyncClient

    target, token = target_and_token(args)
    async with AsyncClient(target, token) as client:
        if args.action == "create":
            labels = dict(item.split("=", 1) for item in args.label)
            session = await client.create_session(
                agent=args.agent, workspace_archive=archive, labels=labels, config_json=config_json,
                cpu=args.cpu, memory_mb=args.memory_mb, pids=args.pids, template=args.template,
                network_allow=[*args.allow_host, *args.allow_cidr], from_snapshot=args.from_snapshot,
            )
            _print_sessions([session], args)
        elif args.action == "list":
            _print_sessions(await client.list_sessions(args.all), args)
        elif args.action == "get":
            _print_sessions([await client.get_session(args.session)], args)
        elif args.action == "delete" and args.keep_snapshot:
            from controlplane.cli_snapshots import print_snapshots

            print_snapshots([await client.delete_keeping(args.session)], args)
        elif args.action == "delete":
            _print_sessions([await client.delete_session(args.session)], args)
        elif args.action in ("fork", "pause", "resume"):
            call = {"fork": client.fork, "pause": client.pause, "resume": client.resume}[args.action]
            _print_sessions([await call(args.session)], args)
        elif args.action == "snapshot":
            from controlplane.cli_snapshots import print_snapshots

            print_snapshots([await client.snapshot(args.session)], args)
    return 0


async def _exec_cmd(args: argparse.Namespace) -> int:
    from controlplane.client import AsyncClient

    target, token = target_and_token(args)
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
    from controlplane.client import AsyncClient

    target, token = target_and_token(args)
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
        found = as_dict(listing)
        # The schema is JSON inside the message: nested as an object, it is not encoded twice.
        for tool, entry in zip(listing.tools, found.get("tools", []), strict=True):
            entry["parameters_json_schema"] = json.loads(tool.parameters_json_schema or "{}")
        print(json.dumps(found, indent=2))
        return 0
    for tool in listing.tools:
        summary = tool.description.splitlines()[0] if tool.description else ""
        print(f"{tool.id:<14} {summary[:100]}")
    for error in listing.load_errors:
        print(f"load error {error.origin}: {error.message}", file=sys.stderr)
    return 0


async def _reload_cmd(args: argparse.Namespace, target: str, token: str) -> int:
    from controlplane.client import AsyncClient

    if not args.reload_session:
        print("controlplane: tools reload needs a SESSION", file=sys.stderr)
        return 2
    async with AsyncClient(target, token) as client:
        report = await client.reload_tools(args.reload_session)
    if args.json:
        print(json.dumps(as_dict(report), indent=2))
        return 0
    for label, items in (("tool added", report.added_tools), ("tool changed", report.changed_tools),
                         ("tool removed", report.removed_tools), ("file added", report.added_files),
                         ("file changed", report.changed_files), ("file removed", report.removed_files)):
        for item in items:
            print(f"{label:<13} {item}")
    for error in report.load_errors:
        print(f"load error {error.origin}: {error.message}", file=sys.stderr)
    return 0


def common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="operator TOML file (default: $CONTROLPLANE_CONFIG)")
    common.add_argument("--target", help="host:port of the control plane (default: the data dir's endpoint)")
    common.add_argument("--token", help="bearer token (default: $CONTROLPLANE_TOKEN or the default tenant's)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return common


def _parser() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    common = common_options()
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
    create.add_argument("--template", default="", help="a template of `template list` (default: the sandbox image)")
    create.add_argument("--allow-host", action="append", default=[], metavar="PATTERN",
                        help="give the session's tools a network to this host (`host`, `*.domain`, `:port` optional); "
                             "repeatable; within the tenant's egress cap")
    create.add_argument("--allow-cidr", action="append", default=[], metavar="CIDR",
                        help="and to these addresses (IP literals in this range); repeatable")
    create.add_argument("--from-snapshot", default="", metavar="ID",
                        help="restore this snapshot (`snapshot list`): its workspace, config and state")
    create.add_argument("-q", "--quiet", action="store_true", help="print only the new session's id")
    listing = actions.add_parser("list", parents=[common])
    listing.add_argument("--all", action="store_true", help="include deleted sessions")
    listing.add_argument("-q", "--quiet", action="store_true", help="print only the ids")
    for name in ("get", "delete", "fork", "snapshot", "pause", "resume"):
        actions.add_parser(name, parents=[common]).add_argument("session")
        if name in ("fork", "snapshot"):
            actions.choices[name].add_argument("-q", "--quiet", action="store_true", help="print only the new id")
    actions.choices["delete"].add_argument("--keep-snapshot", action="store_true",
                                           help="keep its workspace and state as a retained snapshot; print it")
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
    owners: dict[str, Any] = {}
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        before = set(sub.choices)
        module.add_parser(sub, common)
        owners.update(dict.fromkeys(set(sub.choices) - before, module))
    return parser, owners


def _split_words(words: list[str]) -> tuple[list[str], list[str] | None, bool]:
    """(our words, the command after `--` if any, whether --json was given anywhere before it)."""
    command: list[str] | None = None
    # Everything after `--` is the command of `exec`, never options of ours.
    if "--" in words:
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1 :]
    as_json = "--json" in words
    return [w for w in words if w != "--json"], command, as_json


def main(argv: Sequence[str] | None = None) -> int:
    words, command, as_json = _split_words(list(sys.argv[1:] if argv is None else argv))
    parser, owners = _parser()
    args = parser.parse_args(words)
    args.json = as_json
    if command is not None:
        args.argv = [*getattr(args, "argv", []), *command]
    try:
        return _dispatch(args, owners)
    except KeyboardInterrupt:
        # asyncio.run cancelled the command first, so a running call was aborted on its way out.
        return INTERRUPTED
    except Exception as exc:
        return _reported(exc)


def _dispatch(args: argparse.Namespace, owners: dict[str, Any]) -> int:
    if args.command == "serve":
        import logging

        from controlplane import app
        from controlplane.config import load_settings
        from sandbox_agent import event_loop

        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        event_loop.run(app.serve(load_settings(Path(args.config) if args.config else None)))
        return 0
    if args.command == "session":
        return asyncio.run(_session_cmd(args, *_create_inputs(args)))
    if args.command == "tools":
        return asyncio.run(_tools_cmd(args))
    if args.command in owners:
        result: int = asyncio.run(owners[args.command].run(args))
        return result
    return asyncio.run(_exec_cmd(args))


def _reported(exc: Exception) -> int:
    """A refused request or bad configuration is one line on stderr and status 2; anything else is a bug."""
    import grpc

    from controlplane.errors import ControlPlaneError

    if isinstance(exc, grpc.aio.AioRpcError):
        print(f"controlplane: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    if isinstance(exc, ControlPlaneError):
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2
    raise exc


if __name__ == "__main__":
    sys.exit(main())
