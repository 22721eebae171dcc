"""The `lsp` tool: code intelligence (definitions, references, hover, symbols, calls) from a language server.

Results are gathered the way upstream gathers them: one answer per server of the file, failures
counted as no answer, then flattened one level and cleared of null-like values (except `hover`,
whose per-server answers are returned as they are, nulls included).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from opencode_semantics.javascript import json_stringify
from sandbox_agent.lsp.client import LspClient, LspError
from sandbox_agent.lsp.servers import ProcessStarter, ServerSpec, SessionServers, session_servers, specs_for
from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.paths import assert_external_directory, checked_target, read_denied, relative_to_worktree
from sandbox_agent.tools.safe_open import Target, read_bytes

NO_SERVER = "No LSP server available for this file type."
ABORTED = "Tool execution aborted"
WORKSPACE_SYMBOL_KINDS = frozenset({5, 12, 6, 11, 13, 14, 23, 10})
"""Class, Function, Method, Interface, Variable, Constant, Struct, Enum."""
WORKSPACE_SYMBOL_LIMIT = 10


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    work = asyncio.ensure_future(_run(args, ctx))
    aborted = asyncio.ensure_future(ctx.abort.wait())
    try:
        await asyncio.wait([work, aborted], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        aborted.cancel()
    if not work.done():
        work.cancel()
        raise ToolError(ABORTED)
    return work.result()


async def _run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    operation = str(args["operation"])
    line, character = int(args["line"]), int(args["character"])
    file = _resolve(ctx.directory, str(args["filePath"]))
    target = await checked_target(ctx, file)
    await assert_external_directory(ctx, file, real=target.real)
    await ctx.ask("lsp", ["*"], ["*"], {})
    title = f"{operation} {relative_to_worktree(ctx, file)}:{line}:{character}"

    # A directory is "not found" too: upstream asks Bun whether the *file* exists.
    if target.identity is None or target.is_dir or not await ctx.io(os.path.isfile, target.real):
        raise ToolError(f"File not found: {file}")
    if read_denied(ctx, target.names):
        # The file's text would go to a language server and come back in its answers: a read deny holds.
        raise ToolError(f"lsp cannot open {file}: a read rule of this session denies it")
    servers = session_servers(ctx.state, ctx.session_id)
    targets: list[tuple[ServerSpec, str]] = []
    for spec in specs_for(file):
        root = await ctx.io(spec.find_root, file, ctx.directory)
        if servers.usable(spec, root):
            targets.append((spec, root))
    if not targets:
        raise ToolError(NO_SERVER)

    clients = await _open(ctx, servers, targets, file, target)
    position = {"line": line - 1, "character": character - 1}
    result = await OPERATIONS[operation](_Query(file, position, clients, servers))
    output = f"No results found for {operation}" if not result else to_json(result)
    return ToolOutput(title=title, output=output, metadata={"result": result})


def _resolve(directory: str, file_path: str) -> str:
    """Like upstream: an absolute path is taken as given, a relative one is joined (and normalised)."""
    return file_path if os.path.isabs(file_path) else os.path.normpath(os.path.join(directory, file_path))


async def _open(ctx: ToolContext, servers: SessionServers, targets: list[tuple[ServerSpec, str]],
                file: str, target: Target) -> list[LspClient]:
    """Starts (or reuses) the file's servers, sends them its current text and lets them analyse it."""
    # ToolRunner.start accepts `stdin`; the Runner protocol in tools/base.py does not declare it yet.
    starter = cast(ProcessStarter, ctx.runner)
    text = await ctx.io(_read_text, target)
    clients: list[LspClient] = []
    for spec, root in targets:
        client = await servers.client(spec, root, starter, await ctx.io(spec.initialization, root))
        if client is None:
            continue
        try:
            mark = client.publications(file)
            await client.sync_document(file, text, spec.language_id(file))
            if spec.waits_for_diagnostics:
                await client.wait_for_diagnostics(file, mark)
        except LspError:
            continue  # upstream logs a failed touch and goes on; the request below then finds nothing
        clients.append(client)
    return clients


def _read_text(target: Target) -> str:
    """The file as it was checked (safe_open: no link followed again)."""
    return read_bytes(target).decode("utf-8", "replace")


class _Query:
    def __init__(self, file: str, position: dict[str, int], clients: list[LspClient],
                 servers: SessionServers) -> None:
        self.file = file
        self.uri = Path(file).as_uri()
        self.position = position
        self.clients = clients
        self.servers = servers

    def at_position(self, **extra: Any) -> dict[str, Any]:
        return {"textDocument": {"uri": self.uri}, "position": dict(self.position), **extra}

    async def each(self, ask: Callable[[LspClient], Awaitable[Any]], failed: Any,
                   clients: list[LspClient] | None = None) -> list[Any]:
        """One answer per server, `failed` standing in for a server that answered with an error."""

        async def one(client: LspClient) -> Any:
            try:
                return await ask(client)
            except LspError:
                return failed

        return list(await asyncio.gather(*(one(c) for c in (self.clients if clients is None else clients))))


def _flat_truthy(answers: list[Any]) -> list[Any]:
    """JavaScript's `answers.flat().filter(Boolean)`."""
    flat: list[Any] = []
    for answer in answers:
        flat.extend(answer if isinstance(answer, list) else [answer])
    return [item for item in flat if _js_truthy(item)]


def _js_truthy(value: Any) -> bool:
    if value is None or value is False or value == "":
        return False
    return not (isinstance(value, int | float) and not isinstance(value, bool) and value == 0)


async def _hover(q: _Query) -> list[Any]:
    return await q.each(lambda c: c.request("textDocument/hover", q.at_position()), None)


async def _definition(q: _Query) -> list[Any]:
    return _flat_truthy(await q.each(lambda c: c.request("textDocument/definition", q.at_position()), None))


async def _references(q: _Query) -> list[Any]:
    params = q.at_position(context={"includeDeclaration": True})
    return _flat_truthy(await q.each(lambda c: c.request("textDocument/references", params), []))


async def _implementation(q: _Query) -> list[Any]:
    return _flat_truthy(await q.each(lambda c: c.request("textDocument/implementation", q.at_position()), None))


async def _document_symbol(q: _Query) -> list[Any]:
    params = {"textDocument": {"uri": q.uri}}
    return _flat_truthy(await q.each(lambda c: c.request("textDocument/documentSymbol", params), []))


async def _workspace_symbol(q: _Query) -> list[Any]:
    async def ask(client: LspClient) -> list[Any]:
        found = await client.request("workspace/symbol", {"query": ""})
        if not isinstance(found, list):
            return []  # upstream filters the answer, which throws on null and counts as no answer
        kept = [s for s in found if isinstance(s, dict) and s.get("kind") in WORKSPACE_SYMBOL_KINDS]
        return kept[:WORKSPACE_SYMBOL_LIMIT]

    # Workspace-wide: every running server of the session, not only the file's.
    answers = await q.each(ask, [], clients=q.servers.running())
    return [symbol for answer in answers for symbol in answer]


async def _prepare_call_hierarchy(q: _Query) -> list[Any]:
    return _flat_truthy(await q.each(lambda c: c.request("textDocument/prepareCallHierarchy", q.at_position()), []))


def _calls(direction: str) -> Callable[[_Query], Awaitable[list[Any]]]:
    async def calls(q: _Query) -> list[Any]:
        async def ask(client: LspClient) -> Any:
            try:
                items = await client.request("textDocument/prepareCallHierarchy", q.at_position())
            except LspError:
                items = []
            if not isinstance(items, list) or not items:
                return []
            return await client.request(direction, {"item": items[0]})

        return _flat_truthy(await q.each(ask, []))

    return calls


OPERATIONS: dict[str, Callable[[_Query], Awaitable[list[Any]]]] = {
    "goToDefinition": _definition,
    "findReferences": _references,
    "hover": _hover,
    "documentSymbol": _document_symbol,
    "workspaceSymbol": _workspace_symbol,
    "goToImplementation": _implementation,
    "prepareCallHierarchy": _prepare_call_hierarchy,
    "incomingCalls": _calls("callHierarchy/incomingCalls"),
    "outgoingCalls": _calls("callHierarchy/outgoingCalls"),
}


def to_json(value: Any) -> str:
    """`JSON.stringify(value, null, 2)`, as upstream prints a language server's answer."""
    return json_stringify(value, indent=2)


