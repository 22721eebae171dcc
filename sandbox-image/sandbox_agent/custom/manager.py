"""A session's custom tools: loaded from the session's code snapshot in long-lived Bun and Python hosts.

The snapshot (custom/snapshot.py) is taken when the session is created and again only on ReloadTools:
a file written in the workspace later is data, never a tool. Listing scans the snapshot cheaply (a
fingerprint of paths, sizes and mtimes), so the hosts load once per snapshot. Ids follow upstream:
tool files by config dir and name, then plugin tools; the later definition of an id wins in the place
where the id first appeared (JS object key order).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_agent import tracing
from sandbox_agent.custom import discovery, snapshot
from sandbox_agent.custom.files import HostFile, LoadError
from sandbox_agent.custom.host import HostResult, HostTool, Loaded, LogFn, ToolHost, bun_launcher, python_launcher
from sandbox_agent.tool_logs import LogLine
from sandbox_agent.tools.base import AskFn, MetadataFn, ToolError
from sandbox_agent.tools.runner import ToolRunner

AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUN_HOST = os.path.join(os.path.dirname(AGENT_ROOT), "toolhost", "host.ts")
PY_HOST = os.path.join(os.path.dirname(AGENT_ROOT), "pyhost", "host.py")
HOOK_TIMEOUT_S = 10.0


def find_bun() -> str | None:
    import shutil  # only here: shutil (with bz2 and lzma) is 0.3 MiB of every idle agent

    return os.environ.get("AGENT_BUN") or shutil.which("bun") or (
        "/usr/local/bin/bun" if os.path.exists("/usr/local/bin/bun") else None
    )


@dataclass
class CustomListing:
    tools: list[HostTool] = field(default_factory=list)
    load_errors: list[LoadError] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    config_json: str = ""
    """The session's opencode.json after the plugins' `config` hooks; empty when no plugin has one."""
    logs: list[LogLine] = field(default_factory=list)
    """What the tool and plugin files printed while loading (tool_logs.py), with workspace paths."""


@dataclass(frozen=True)
class _Scan:
    tool_files: list[HostFile]
    plugin_files: list[HostFile]
    problems: list[LoadError]
    fingerprint: str


class CustomTools:
    def __init__(self, runner: ToolRunner, workspace: str, tool_home: str, worktree: str = "/",
                 code_dir: str | None = None, private_code_dir: bool = False) -> None:
        self._runner = runner
        self._workspace = workspace
        self._tool_home = tool_home
        self._worktree = worktree
        # Beside the tool user's HOME: the sticky /tmp tmpfs in a container, the sandbox's dir on the local plane.
        self._code_dir = code_dir or os.path.dirname(tool_home.rstrip("/")) or "/tmp"
        # In a container: the providers' own tmpfs, refused unless no tool process can write it or an ancestor
        # (Bun looks upward from each loaded file for node_modules, package.json, tsconfig.json).
        self._private_code_dir = private_code_dir
        self.snapshot: snapshot.CodeSnapshot | None = None
        """The code this session runs; None until it is taken (at create, or before the first listing)."""
        self._bun: ToolHost | None = None
        self._python: ToolHost | None = None
        self._owners: dict[str, ToolHost] = {}
        self._listing = CustomListing()
        self._fingerprint: str | None = None
        self._lock = asyncio.Lock()
        self._warming: asyncio.Task[None] | None = None

    def _host_env(self) -> dict[str, str]:
        return {"HOME": self._tool_home, "NO_COLOR": "1"}

    def _bun_host(self) -> ToolHost | None:
        bun = find_bun()
        if bun is None:
            return None
        if self._bun is None:
            launch = bun_launcher(self._runner, bun, BUN_HOST, self._workspace, self._host_env())
            self._bun = ToolHost(launch, "bun")
        return self._bun

    def _python_host(self) -> ToolHost:
        if self._python is None:
            python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
            launch = python_launcher(self._runner, python, PY_HOST, self._workspace, self._host_env())
            self._python = ToolHost(launch, "python")
        return self._python

    async def take_snapshot(self, config: Mapping[str, Any], env: Mapping[str, str], worktree: str) -> snapshot.Changes:
        """Copies the session's custom code as the workspace holds it now (CreateSession, ReloadTools); what
        changed since the snapshot in force. On SnapshotError the snapshot in force stays."""
        async with self._lock:
            self._worktree = worktree
            fresh = await self._take(config, env, worktree)
            before, self.snapshot = self.snapshot, fresh
            if before is not None:
                # The old code goes with its modules and plugin state: the hosts start afresh on the next listing.
                await self.close()
                self._listing, self._owners, self._fingerprint = CustomListing(), {}, None
                await asyncio.to_thread(snapshot.remove, before.root)
            self._warming = asyncio.get_running_loop().create_task(self._warm(fresh, dict(config)))
            return snapshot.changes(before, fresh)

    async def _warm(self, code: snapshot.CodeSnapshot, config: dict[str, Any]) -> None:
        """Starts the hosts this snapshot's files need while the client is still busy with the session's creation.

        A host's start (an interpreter and its imports, the identity checks) was most of a session's first listing;
        started here, the listing finds it running. Nothing is imported yet: tool code still first runs when the
        tools are listed, as before. A failed start is not reported here: the listing starts the host again and
        reports what fails then. No span: the request that took the snapshot has ended by then."""
        tracing.detach()
        try:
            scan = await self._runner.io(self._scan, code, config)
        except Exception:  # the listing scans again and reports what is wrong
            return
        hosts: list[ToolHost] = []
        if any(f.path.endswith(".py") for f in scan.tool_files):
            hosts.append(self._python_host())
        if any(not f.path.endswith(".py") for f in scan.tool_files) or scan.plugin_files:
            bun = self._bun_host()
            if bun is not None:
                hosts.append(bun)
        await asyncio.gather(*(host.start() for host in hosts), return_exceptions=True)

    async def _take(self, config: Mapping[str, Any], env: Mapping[str, str], worktree: str) -> snapshot.CodeSnapshot:
        return await snapshot.take(self._runner, base=self._code_dir, workspace=self._workspace, worktree=worktree,
                                   home=self._tool_home, config=config, env=env, private=self._private_code_dir)

    async def listing(self, config: Mapping[str, Any], env: Mapping[str, str], worktree: str) -> CustomListing:
        async with self._lock:
            self._worktree = worktree
            if self.snapshot is None:
                # A control plane that took none at create: taken now, still before any tool call can run
                # (a session's calls list its tools first).
                self.snapshot = await self._take(config, env, worktree)
            scan = await self._runner.io(self._scan, self.snapshot, dict(config))
            if scan.fingerprint == self._fingerprint:
                return self._listing
            self._listing = await self._load(scan, config)
            self._fingerprint = scan.fingerprint
            return self._listing

    def _scan(self, code: snapshot.CodeSnapshot, config: dict[str, Any]) -> _Scan:
        roots = [code.root, discovery.GLOBAL_DIR]
        dirs = [code.inside(d) for d in code.config_dirs]
        tools, problems = discovery.tool_files(dirs, allowed_roots=roots)
        plugins, plugin_problems = discovery.plugin_files(dirs, code.plugin_specs, self._workspace,
                                                          allowed_roots=roots)
        everything = [*tools, *plugins]
        key = code.root + "|" + discovery.fingerprint(everything)
        key += "|" + "|".join(f"{p.origin}:{p.message}" for p in problems)
        key += "|" + json.dumps(config, sort_keys=True)  # the plugins' `config` hooks start from it
        return _Scan(tools, plugins, [*problems, *plugin_problems], key)

    async def _load(self, scan: _Scan, config: Mapping[str, Any]) -> CustomListing:
        order = {f.path: i for i, f in enumerate([*scan.tool_files, *scan.plugin_files])}
        js = [f for f in scan.tool_files if not f.path.endswith(".py")] + list(scan.plugin_files)
        py = [f for f in scan.tool_files if f.path.endswith(".py")]
        problems = list(scan.problems)
        loaded: list[tuple[ToolHost, Loaded]] = []
        # Only a host with files to load (or that holds files it must now drop) runs: an idle Bun host is a start
        # of its own on a session's first listing and tens of MiB for the session's whole life.
        bun = self._bun_host() if js or self._bun is not None else None
        if js and bun is None:
            problems += [LoadError(f.path, "Bun is not available in this sandbox") for f in js]
        elif bun is not None:
            loaded.append((bun, await self._load_into(bun, js, problems, config)))
        if py or self._python is not None:
            python = self._python_host()
            loaded.append((python, await self._load_into(python, py, problems, config)))
        hooks: list[str] = []
        for _, result in loaded:
            problems += result.load_errors
            hooks += [h for h in result.hooks if h not in hooks]
        winners = merge_definitions([(host, result.tools, result.notes) for host, result in loaded], order)
        self._owners = {tool.id: host for tool, host in winners}
        configured = next((result.config_json for _, result in loaded if result.config_json), "")
        shown = self.snapshot.outside if self.snapshot is not None else str
        tools = [dataclasses.replace(tool, origin=shown(tool.origin)) for tool, _ in winners]
        errors = [LoadError(shown(p.origin), shown(p.message)) for p in problems]
        logs = [dataclasses.replace(line, origin=shown(line.origin)) for _, result in loaded for line in result.logs]
        return CustomListing(tools, errors, hooks, configured, logs)

    async def _load_into(self, host: ToolHost, files: Sequence[HostFile], problems: list[LoadError],
                         config: Mapping[str, Any]) -> Loaded:
        try:
            with tracing.child(f"toolhost.load {host.name}", {"sandbox.files": len(files)}):
                return await host.load(list(files), self._workspace, self._worktree, config)
        except ToolError as exc:
            problems += [LoadError(f.path, f"the {host.name} tool host failed: {exc}") for f in files]
            return Loaded([], [], [], [])

    def owns(self, tool_id: str) -> bool:
        return tool_id in self._owners

    async def call(
        self, tool_id: str, args: dict[str, Any], context: dict[str, Any], *, on_metadata: MetadataFn, on_ask: AskFn,
        abort: asyncio.Event, timeout_s: float | None = None, on_log: LogFn | None = None,
    ) -> HostResult:
        host = self._owners.get(tool_id)
        if host is None:
            raise ToolError(f"no custom tool named {tool_id!r} is loaded in this sandbox; list the tools again")
        logged = None
        if on_log is not None:
            shown = self.snapshot.outside if self.snapshot is not None else str
            report = on_log

            def logged(line: LogLine) -> None:
                report(dataclasses.replace(line, origin=shown(line.origin)))

        return await host.call(tool_id, args, context, on_metadata=on_metadata, on_ask=on_ask, abort=abort,
                               timeout_s=timeout_s, on_log=logged)

    async def hook(self, name: str, input_: dict[str, Any], output: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._bun is None or name not in self._listing.hooks:
            return output
        return await self._bun.hook(name, input_, output, timeout_s or HOOK_TIMEOUT_S)

    async def close(self) -> None:
        warming, self._warming = self._warming, None
        if warming is not None:
            await warming  # a host it is starting must be closed below, not left running
        hosts = [h for h in (self._bun, self._python) if h is not None]
        self._bun = self._python = None
        await asyncio.gather(*(h.close() for h in hosts), return_exceptions=True)


REPLACES = " replaces the one from "
"""How both hosts note an id defined again by a later file: `tool ID replaces the one from ORIGIN`."""


def merge_definitions(
    hosts: Sequence[tuple[ToolHost, Sequence[HostTool], Sequence[LoadError]]], order: Mapping[str, int],
) -> list[tuple[HostTool, ToolHost]]:
    """One definition per id, listed like the keys of a JS object filled in file order (`order` ranks the
    files): the last definition of an id wins but stays where the id first appeared.

    Each host already lists its own tools that way and returns only its winners, so where an id first
    appeared is read from the host's replacement notes; an id that both hosts define is merged here."""
    unknown = len(order)
    # id -> (where it first appeared, where its winning definition is, that definition, its host)
    merged: dict[str, tuple[tuple[int, int, int], tuple[int, int], HostTool, ToolHost]] = {}
    for host_rank, (host, tools, notes) in enumerate(hosts):
        first_file = {t.id: order.get(t.origin, unknown) for t in tools}
        for note in notes:
            if not note.message.startswith("tool "):
                continue
            tool_id, found, earlier = note.message[len("tool "):].partition(REPLACES)
            if found and tool_id in first_file:
                first_file[tool_id] = min(first_file[tool_id], order.get(earlier, unknown))
        for position, tool in enumerate(tools):
            first = (first_file[tool.id], host_rank, position)
            defined = (order.get(tool.origin, unknown), host_rank)
            winner, owner = tool, host
            known = merged.get(tool.id)
            if known is not None:
                first = min(first, known[0])
                if known[1] > defined:
                    defined, winner, owner = known[1], known[2], known[3]
            merged[tool.id] = (first, defined, winner, owner)
    return [(tool, host) for _, _, tool, host in sorted(merged.values(), key=lambda item: item[0])]
