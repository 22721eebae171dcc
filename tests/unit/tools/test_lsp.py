"""The `lsp` tool against a real jedi-language-server started as a real process (the venv's Python)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.calls.tool import InitContext, ToolError
from controlplane.core.definitions.schema import parameters_schema
from controlplane.core.definitions.validation import validate
from controlplane.tools.lsp import TOOL, LspParams
from sandbox_agent.lsp import close_all, close_session, servers
from sandbox_agent.lsp.client import FrameDecoder, LspClient, LspProtocolError, encode_message
from sandbox_agent.lsp.servers import PYTHON, ServerSpec
from sandbox_agent.tools import lsp
from sandbox_agent.tools.base import SessionState, ToolContext
from sandbox_agent.tools.base import ToolError as AgentToolError
from sandbox_agent.tools.runner import ToolRunner
from tests.unit.tools.conftest import Recorder

REPO = Path(__file__).resolve().parents[3]
SHAPES = '''"""Shapes."""


class Square:
    """A square with a side."""

    def __init__(self, side: int) -> None:
        self.side = side

    def area(self) -> int:
        return self.side * self.side


def make(side: int) -> Square:
    return Square(side)
'''
MAIN = '''from shapes import Square, make


def run() -> int:
    first = make(2)
    second = Square(3)
    return first.area() + second.area()
'''
REJECTED = "The user rejected permission to use this specific tool call."


@pytest.fixture
async def ctx(project: Path, make_ctx: Callable[..., ToolContext]) -> AsyncIterator[ToolContext]:
    (project / "shapes.py").write_text(SHAPES)
    (project / "main.py").write_text(MAIN)
    context = make_ctx(worktree=str(project))
    yield context
    await close_session(context.session_id)


async def call(ctx: ToolContext, operation: str, file: str, line: int = 1, character: int = 1) -> Any:
    return await lsp.run({"operation": operation, "filePath": file, "line": line, "character": character}, ctx)


def rng(l1: int, c1: int, l2: int, c2: int) -> dict[str, Any]:
    return {"start": {"line": l1, "character": c1}, "end": {"line": l2, "character": c2}}


def symbol(uri: str, name: str, kind: int, container: str, r: dict[str, Any]) -> dict[str, Any]:
    return {"location": {"uri": uri, "range": r}, "name": name, "kind": kind, "containerName": container}


def server_pids(ctx: ToolContext) -> list[int]:
    assert ctx.state.lsp is not None
    return [client.pid for client in ctx.state.lsp.running()]


def process_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- operations ---------------------------------------------------------------------------------


async def test_go_to_definition_across_files_exact_output(ctx: ToolContext, project: Path) -> None:
    out = await call(ctx, "goToDefinition", "main.py", 5, 13)  # `make` in `first = make(2)`
    assert out.title == "goToDefinition main.py:5:13"
    assert out.output == (
        "[\n"
        "  {\n"
        f'    "uri": "{(project / "shapes.py").as_uri()}",\n'
        '    "range": {\n'
        '      "start": {\n'
        '        "line": 13,\n'
        '        "character": 4\n'
        "      },\n"
        '      "end": {\n'
        '        "line": 13,\n'
        '        "character": 8\n'
        "      }\n"
        "    }\n"
        "  }\n"
        "]"
    )
    assert out.metadata == {"result": [{"uri": (project / "shapes.py").as_uri(), "range": rng(13, 4, 13, 8)}]}


async def test_document_symbol_lists_every_symbol_of_the_file(ctx: ToolContext, project: Path) -> None:
    out = await call(ctx, "documentSymbol", str(project / "main.py"))
    uri = (project / "main.py").as_uri()
    assert out.title == "documentSymbol main.py:1:1"
    # The client declares upstream's capabilities (no hierarchical symbols), so jedi answers flat.
    assert json.loads(out.output) == [
        symbol(uri, "Square", 5, "shapes.Square", rng(0, 19, 0, 25)),
        symbol(uri, "make", 12, "shapes.make", rng(0, 27, 0, 31)),
        symbol(uri, "run", 12, "main.run", rng(3, 4, 3, 7)),
        symbol(uri, "first", 13, "main.run.first", rng(4, 4, 4, 9)),
        symbol(uri, "second", 13, "main.run.second", rng(5, 4, 5, 10)),
    ]
    assert out.output == json.dumps(out.metadata["result"], indent=2)


async def test_hover_gives_the_servers_answer_and_null_where_there_is_nothing(ctx: ToolContext) -> None:
    out = await call(ctx, "hover", "main.py", 6, 14)  # `Square` in `second = Square(3)`
    assert json.loads(out.output) == [{
        "contents": {
            "kind": "plaintext",
            "value": "class Square(side: int)\n---\nA square with a side.\nFull name: shapes.Square",
        },
        "range": rng(5, 13, 5, 19),
    }]
    # Upstream keeps one answer per server, unfiltered: nothing to hover is a list holding null.
    blank = await call(ctx, "hover", "main.py", 3, 1)
    assert blank.output == "[\n  null\n]"
    assert blank.metadata == {"result": [None]}


async def test_find_references_includes_the_declaration(ctx: ToolContext, project: Path) -> None:
    out = await call(ctx, "findReferences", "shapes.py", 10, 9)  # `def area`
    main, shapes = (project / "main.py").as_uri(), (project / "shapes.py").as_uri()
    assert json.loads(out.output) == [
        {"uri": main, "range": rng(6, 17, 6, 21)},
        {"uri": main, "range": rng(6, 33, 6, 37)},
        {"uri": shapes, "range": rng(9, 8, 9, 12)},
    ]


@pytest.mark.timeout(180)
async def test_workspace_symbol_keeps_upstreams_kinds_and_at_most_ten(ctx: ToolContext, project: Path) -> None:
    # Twelve functions and a constant: only ten symbols survive; the module-level import alias does not count.
    body = "".join(f"def f{i:02d}() -> None:\n    pass\n\n\n" for i in range(12))
    (project / "many.py").write_text(body)
    out = await call(ctx, "workspaceSymbol", "main.py", 1, 1)
    assert out.title == "workspaceSymbol main.py:1:1"
    result = json.loads(out.output)
    assert len(result) == 10
    assert all(item["kind"] in (5, 6, 12, 13) for item in result)
    assert {item["location"]["uri"] for item in result} <= {
        (project / name).as_uri() for name in ("many.py", "main.py", "shapes.py")
    }


async def test_operations_jedi_lacks_say_no_results(ctx: ToolContext) -> None:
    # jedi has no implementation or call hierarchy support: its error counts as no answer, as upstream.
    for operation in ("goToImplementation", "prepareCallHierarchy", "incomingCalls", "outgoingCalls"):
        out = await call(ctx, operation, "shapes.py", 14, 5)
        assert out.output == f"No results found for {operation}"
        assert out.metadata == {"result": []}
    empty = await call(ctx, "goToDefinition", "main.py", 3, 1)
    assert empty.output == "No results found for goToDefinition"


async def test_changed_file_is_sent_again(ctx: ToolContext, project: Path) -> None:
    first = await call(ctx, "documentSymbol", "shapes.py")
    assert [s["name"] for s in json.loads(first.output)] == ["Square", "__init__", "side", "area", "make"]
    (project / "shapes.py").write_text(SHAPES + "\n\ndef extra() -> None:\n    pass\n")
    second = await call(ctx, "documentSymbol", "shapes.py")
    assert [s["name"] for s in json.loads(second.output)] == ["Square", "__init__", "side", "area", "make", "extra"]
    assert len(server_pids(ctx)) == 1


async def test_non_ascii_text_is_kept_in_the_output(ctx: ToolContext, project: Path) -> None:
    (project / "uni.py").write_text('def grüße() -> str:\n    return "é"\n')
    out = await call(ctx, "documentSymbol", "uni.py")
    assert '"name": "grüße"' in out.output


# -- errors, asks and titles --------------------------------------------------------------------


async def test_unknown_file_types_have_no_server(ctx: ToolContext, project: Path, recorder: Recorder) -> None:
    for name in ("notes.txt", "Makefile", ".pythonrc", "script.py.bak"):
        (project / name).write_text("x = 1\n")
        with pytest.raises(AgentToolError) as err:
            await call(ctx, "hover", name)
        assert str(err.value) == "No LSP server available for this file type."
    assert [a.permission for a in recorder.asks] == ["lsp"] * 4
    assert ctx.state.lsp is not None
    assert ctx.state.lsp.running() == []


async def test_missing_file_and_directory_are_not_found(ctx: ToolContext, project: Path, recorder: Recorder) -> None:
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", "nope.py")
    assert str(err.value) == f"File not found: {project}/nope.py"
    (project / "pkg.py").mkdir()
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", str(project / "pkg.py"))
    assert str(err.value) == f"File not found: {project}/pkg.py"
    # The permission is asked before the file is looked at.
    assert [(a.permission, a.patterns, a.always, a.metadata) for a in recorder.asks] == [("lsp", ["*"], ["*"], {})] * 2


async def test_absolute_path_is_kept_as_given(ctx: ToolContext, project: Path) -> None:
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", f"{project}/sub/../gone.py")
    assert str(err.value) == f"File not found: {project}/sub/../gone.py"


async def test_file_outside_the_project_asks_external_directory_first(
    ctx: ToolContext, project: Path, recorder: Recorder
) -> None:
    outside = project.parent / "elsewhere"
    outside.mkdir()
    (outside / "ext.py").write_text("def outer() -> int:\n    return 1\n")
    out = await call(ctx, "documentSymbol", str(outside / "ext.py"))
    assert [(a.permission, a.patterns, a.always) for a in recorder.asks] == [
        ("external_directory", [f"{outside}/*"], [f"{outside}/*"]),
        ("lsp", ["*"], ["*"]),
    ]
    assert recorder.asks[0].metadata == {"filepath": f"{outside}/ext.py", "parentDir": str(outside)}
    assert out.title == "documentSymbol ../elsewhere/ext.py:1:1"
    assert [s["name"] for s in json.loads(out.output)] == ["outer"]


async def test_rejected_external_directory_stops_before_lsp(
    ctx: ToolContext, project: Path, recorder: Recorder
) -> None:
    recorder.deny = {"external_directory"}
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", "/etc/hostname.py")
    assert str(err.value) == REJECTED
    assert [a.permission for a in recorder.asks] == ["external_directory"]


async def test_denied_lsp_starts_no_server(ctx: ToolContext, recorder: Recorder) -> None:
    recorder.deny = {"lsp"}
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", "main.py", 1, 1)
    assert str(err.value) == REJECTED
    assert ctx.state.lsp is None


async def test_title_outside_git_is_relative_to_the_root(
    project: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    (project / "a.py").write_text("A = 1\n")
    context = make_ctx(worktree="/")
    try:
        out = await call(context, "documentSymbol", "a.py", 7, 3)
        assert out.title == f"documentSymbol {str(project)[1:]}/a.py:7:3"
    finally:
        await close_session(context.session_id)


async def test_abort_ends_the_call(ctx: ToolContext) -> None:
    ctx.abort.set()
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", "main.py", 1, 1)
    assert str(err.value) == "Tool execution aborted"


# -- server lifetime ----------------------------------------------------------------------------


async def test_one_server_per_root_reused_between_calls(ctx: ToolContext, project: Path) -> None:
    await call(ctx, "hover", "main.py")
    await call(ctx, "hover", "shapes.py")
    assert len(server_pids(ctx)) == 1
    # A nested project marker makes a second root, hence a second server.
    sub = project / "sub"
    sub.mkdir()
    (sub / "pyproject.toml").write_text("[project]\nname = 'sub'\n")
    (sub / "s.py").write_text("S = 1\n")
    await call(ctx, "hover", "sub/s.py")
    assert ctx.state.lsp is not None
    assert sorted(c.root for c in ctx.state.lsp.running()) == [str(project), str(sub)]


async def test_crashed_server_is_restarted_on_the_next_call(ctx: ToolContext) -> None:
    before = await call(ctx, "goToDefinition", "main.py", 5, 13)
    [pid] = server_pids(ctx)
    os.killpg(pid, signal.SIGKILL)
    assert ctx.state.lsp is not None
    for _ in range(200):
        if not ctx.state.lsp.running():
            break
        await asyncio.sleep(0.01)
    assert ctx.state.lsp.running() == []
    after = await call(ctx, "goToDefinition", "main.py", 5, 13)
    assert after.output == before.output
    [new_pid] = server_pids(ctx)
    assert new_pid != pid


async def test_server_that_cannot_start_is_broken_for_good(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = ServerSpec(
        id="failing", extensions=frozenset({".py"}), language_ids={".py": "python"}, root_markers=(),
        argv=(sys.executable, "-c", "import sys; sys.exit(3)"),
    )
    monkeypatch.setattr(servers, "SERVERS", (failing,))
    # Like upstream: the first call still finds a server on paper, then gets no answer from it.
    first = await call(ctx, "hover", "main.py")
    assert first.output == "No results found for hover"
    with pytest.raises(AgentToolError) as err:
        await call(ctx, "hover", "main.py")
    assert str(err.value) == "No LSP server available for this file type."


async def test_close_session_and_close_all_stop_the_servers(
    ctx: ToolContext, make_ctx: Callable[..., ToolContext]
) -> None:
    await call(ctx, "hover", "main.py")
    [pid] = server_pids(ctx)
    await close_session(ctx.session_id)
    assert process_gone(pid)
    # The next call of the same session starts a fresh server.
    await call(ctx, "hover", "main.py")
    [again] = server_pids(ctx)
    other = make_ctx(worktree=ctx.worktree, state=SessionState())
    other.session_id = "ses_other"
    await call(other, "hover", "main.py")
    [third] = server_pids(other)
    await close_all()
    assert process_gone(again)
    assert process_gone(third)


# -- pieces -------------------------------------------------------------------------------------


def test_find_root_takes_the_nearest_marker_up_to_the_project(tmp_path: Path) -> None:
    project = tmp_path / "p"
    deep = project / "a" / "b"
    deep.mkdir(parents=True)
    (project / "a" / "setup.cfg").write_text("")
    assert PYTHON.find_root(str(deep / "x.py"), str(project)) == str(project / "a")
    assert PYTHON.find_root(str(project / "y.py"), str(project)) == str(project)
    (tmp_path / "requirements.txt").write_text("")  # above the project: not looked at
    assert PYTHON.find_root(str(project / "y.py"), str(project)) == str(project)
    assert PYTHON.find_root(str(tmp_path / "out" / "z.py"), str(project)) == str(tmp_path)


def test_initialization_points_jedi_at_the_projects_venv(tmp_path: Path) -> None:
    assert PYTHON.initialization(str(tmp_path)) == {"diagnostics": {"enable": False}}
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    assert PYTHON.initialization(str(tmp_path)) == {
        "diagnostics": {"enable": False}, "workspace": {"environmentPath": str(tmp_path / "venv")},
    }


def test_frame_decoder_handles_split_and_joined_messages() -> None:
    first, second = encode_message({"id": 1, "result": "héllo"}), encode_message({"method": "x"})
    assert first.startswith(b"Content-Length: 26\r\n\r\n")  # bytes, not characters
    decoder = FrameDecoder()
    stream = first + second
    got: list[Any] = []
    for i in range(len(stream)):
        got.extend(decoder.feed(stream[i:i + 1]))
    assert got == [{"id": 1, "result": "héllo"}, {"method": "x"}]
    assert FrameDecoder().feed(stream) == got
    headers = b"content-length: 2\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{}"
    assert FrameDecoder().feed(headers) == [{}]
    with pytest.raises(LspProtocolError):
        FrameDecoder().feed(b"Content-Type: x\r\n\r\n{}")
    with pytest.raises(LspProtocolError):
        FrameDecoder().feed(b"Content-Length: 3\r\n\r\n{x}")


def test_json_is_written_the_way_javascript_writes_it() -> None:
    assert lsp.to_json([{"a": 1.0, "b": [], "c": {}, "d": "é", "e": 0.5}]) == (
        '[\n  {\n    "a": 1,\n    "b": [],\n    "c": {},\n    "d": "é",\n    "e": 0.5\n  }\n]'
    )
    assert lsp.to_json(["\ud800"]) == '[\n  "\\ud800"\n]'


async def test_client_waits_for_published_diagnostics(runner: ToolRunner, tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("def broken(:\n    pass\n")
    execution = await runner.start(list(PYTHON.argv), cwd=str(tmp_path), env={}, timeout_s=None,
                                   merge_stderr=False, stdin=True)
    client = await LspClient.start(execution, name="jedi", root=str(tmp_path))  # diagnostics on
    try:
        mark = client.publications(str(path))
        assert await client.sync_document(str(path), path.read_text(), "python") == 0
        assert await client.wait_for_diagnostics(str(path), mark)
        assert client.diagnostics[str(path)] == [{
            "range": rng(0, 11, 0, 12), "message": "SyntaxError: invalid syntax (broken.py, line 1)",
            "severity": 1, "source": "compile",
        }]
        # Nothing new was sent: nothing new is published.
        assert not await client.wait_for_diagnostics(str(path), client.publications(str(path)), timeout_s=0.3)
        mark = client.publications(str(path))
        assert await client.sync_document(str(path), "def fixed():\n    pass\n", "python") == 1
        assert await client.wait_for_diagnostics(str(path), mark)
        assert client.diagnostics[str(path)] == []
    finally:
        await client.close()
    assert not client.alive
    assert process_gone(client.pid)


# -- the control-plane side ---------------------------------------------------------------------


def find_bun() -> Path:
    candidates = [REPO / "build" / "image" / "bun", *sorted(REPO.glob("build/cache/bun-*/package/bin/bun"))]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (run `make image`)")


ZOD_SCRIPT = """
import { z } from "zod"
const ops = ["goToDefinition", "findReferences", "hover", "documentSymbol", "workspaceSymbol",
  "goToImplementation", "prepareCallHierarchy", "incomingCalls", "outgoingCalls"]
const schema = z.object({
  operation: z.enum(ops).describe("The LSP operation to perform"),
  filePath: z.string().describe("The absolute or relative path to the file"),
  line: z.number().int().min(1).describe("The line number (1-based, as shown in editors)"),
  character: z.number().int().min(1).describe("The character offset (1-based, as shown in editors)"),
})
const cases = JSON.parse(process.argv[2])
const errors = cases.map((args) => { const r = schema.safeParse(args); return r.success ? null : String(r.error) })
console.log(JSON.stringify({ schema: z.toJSONSchema(schema), errors }))
"""
VALIDATION_CASES: list[dict[str, Any]] = [
    {"operation": "hover", "filePath": "a.py", "line": 0, "character": 1},
    {"operation": "rename", "filePath": "a.py", "line": 1.5, "character": "2"},
    {"filePath": 3},
]


def test_schema_and_validation_match_real_zod(tmp_path: Path) -> None:
    modules = REPO / "build" / "image" / "node_modules"
    if not (modules / "zod").is_dir():
        pytest.fail("build/image/node_modules/zod is missing (run `make image`)")
    (tmp_path / "node_modules").symlink_to(modules)
    (tmp_path / "schema.mjs").write_text(ZOD_SCRIPT)
    proc = subprocess.run(
        [str(find_bun()), "--no-install", str(tmp_path / "schema.mjs"), json.dumps(VALIDATION_CASES)],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path,
    )
    zod = json.loads(proc.stdout)
    assert json.dumps(parameters_schema(LspParams)) == json.dumps(zod["schema"])
    for args, expected in zip(VALIDATION_CASES, zod["errors"], strict=True):
        with pytest.raises(ToolError) as err:
            validate("lsp", LspParams, args)
        assert str(err.value) == (
            f"The lsp tool was called with invalid arguments: {expected}.\n"
            "Please rewrite the input so it satisfies the expected schema."
        )


async def test_control_plane_definition() -> None:
    assert TOOL.id == "lsp"
    definition = await TOOL.init(InitContext(agent="build"))
    assert definition.parameters is LspParams
    assert definition.description.startswith("Asks a Language Server Protocol (LSP) server")
    assert "No results found for" in definition.description
