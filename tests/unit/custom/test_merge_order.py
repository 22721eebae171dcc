"""Listing order when a later file defines an id again: JS object key order (the id keeps its first place,
the last definition wins), across the operator's global dir, the project, plugins and both real hosts."""

from __future__ import annotations

import textwrap
from pathlib import Path

from sandbox_agent.custom.files import LoadError
from sandbox_agent.custom.host import HostFile, HostTool, Loaded, ToolHost
from sandbox_agent.custom.manager import merge_definitions
from tests.unit.custom.conftest import Sandbox


def ts_tool(description: str, *, named: str = "") -> str:
    body = f'tool({{ description: "{description}", args: {{}}, async execute() {{ return "{description}" }} }})'
    extra = f"export const {named} = {body}\n" if named else ""
    return f'import {{ tool }} from "@opencode-ai/plugin"\nexport default {body}\n{extra}'


def py_tool(description: str) -> str:
    return textwrap.dedent(f"""
        from opencode_tool import tool


        @tool(description="{description}", args={{"type": "object", "properties": {{}}}})
        async def default(args, ctx):
            return "{description}"
    """)


PLUGIN_ECHO = """import { tool } from "@opencode-ai/plugin"
export const Echoes = async () => ({
  tool: { echo: tool({ description: "echo (plugin)", args: {}, async execute() { return "plugin" } }) },
})
"""


def write(path: Path, source: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return str(path)


async def load(host: ToolHost, sandbox: Sandbox, files: list[HostFile]) -> Loaded:
    loaded = await host.load(files, str(sandbox.project), str(sandbox.project))
    assert loaded.load_errors == []
    return loaded


def listing(merged: list[tuple[HostTool, ToolHost]]) -> list[tuple[str, str, str]]:
    return [(tool.id, tool.description, tool.origin) for tool, _ in merged]


async def test_a_project_tool_replacing_a_global_one_stays_in_the_global_place(
    sandbox: Sandbox, bun_host: ToolHost,
) -> None:
    global_tools = sandbox.root / "global" / "tool"
    operator = write(global_tools / "operator.ts", ts_tool("operator", named="vandal"))
    shared_global = write(global_tools / "shared.ts", ts_tool("shared (global)"))
    echo = sandbox.tool("echo.ts", ts_tool("echo"))
    shared_project = sandbox.tool("shared.ts", ts_tool("shared (project)"))
    files = [HostFile(p, "tool") for p in (operator, shared_global, echo, shared_project)]
    order = {f.path: i for i, f in enumerate(files)}

    loaded = await load(bun_host, sandbox, files)
    merged = merge_definitions([(bun_host, loaded.tools, loaded.notes)], order)
    assert listing(merged) == [
        ("operator", "operator", operator), ("operator_vandal", "operator", operator),
        ("shared", "shared (project)", shared_project), ("echo", "echo", echo),
    ]
    assert all(host is bun_host for _, host in merged)
    assert (await sandbox.call(bun_host, "shared", {})).output == "shared (project)"


async def test_a_plugin_tool_replacing_a_file_tool_keeps_the_files_place(sandbox: Sandbox, bun_host: ToolHost) -> None:
    echo = sandbox.tool("echo.ts", ts_tool("echo"))
    zeta = sandbox.tool("zeta.ts", ts_tool("zeta"))
    plugin = sandbox.write(".opencode/plugin/echoes.ts", PLUGIN_ECHO)
    files = [HostFile(echo, "tool"), HostFile(zeta, "tool"), HostFile(plugin, "plugin")]
    loaded = await load(bun_host, sandbox, files)
    merged = merge_definitions([(bun_host, loaded.tools, loaded.notes)], {f.path: i for i, f in enumerate(files)})
    assert listing(merged) == [("echo", "echo (plugin)", plugin), ("zeta", "zeta", zeta)]
    assert [tool.source for tool, _ in merged] == ["PLUGIN", "CUSTOM"]


async def test_an_id_defined_by_both_hosts_goes_to_the_later_file_in_the_first_place(
    sandbox: Sandbox, bun_host: ToolHost, py_host: ToolHost,
) -> None:
    global_tools = sandbox.root / "global" / "tool"
    first = write(global_tools / "first.ts", ts_tool("first"))
    shared_py = write(global_tools / "shared.py", py_tool("shared (global, python)"))
    other_py = write(global_tools / "zz.py", py_tool("zz"))
    echo = sandbox.tool("echo.ts", ts_tool("echo"))
    shared_ts = sandbox.tool("shared.ts", ts_tool("shared (project, bun)"))
    order = {path: i for i, path in enumerate([first, shared_py, other_py, echo, shared_ts])}

    js = await load(bun_host, sandbox, [HostFile(first, "tool"), HostFile(echo, "tool"), HostFile(shared_ts, "tool")])
    py = await load(py_host, sandbox, [HostFile(shared_py, "tool"), HostFile(other_py, "tool")])
    for hosts in ([(bun_host, js), (py_host, py)], [(py_host, py), (bun_host, js)]):  # host order is irrelevant
        merged = merge_definitions([(host, loaded.tools, loaded.notes) for host, loaded in hosts], order)
        assert listing(merged) == [
            ("first", "first", first), ("shared", "shared (project, bun)", shared_ts), ("zz", "zz", other_py),
            ("echo", "echo", echo),
        ]
        assert [host for _, host in merged] == [bun_host, bun_host, py_host, bun_host]

    # The other way round: the project's Python file wins, still in the global TypeScript one's place.
    shared_ts_global = write(global_tools / "shared.ts", ts_tool("shared (global, bun)"))
    shared_py_project = sandbox.tool("shared.py", py_tool("shared (project, python)"))
    order = {path: i for i, path in enumerate([first, shared_ts_global, echo, shared_py_project])}
    js = await load(bun_host, sandbox, [HostFile(first, "tool"), HostFile(shared_ts_global, "tool"),
                                        HostFile(echo, "tool")])
    py = await load(py_host, sandbox, [HostFile(shared_py_project, "tool")])
    merged = merge_definitions([(bun_host, js.tools, js.notes), (py_host, py.tools, py.notes)], order)
    assert listing(merged) == [
        ("first", "first", first), ("shared", "shared (project, python)", shared_py_project), ("echo", "echo", echo),
    ]
    assert [host for _, host in merged] == [bun_host, py_host, bun_host]
    assert (await sandbox.call(py_host, "shared", {})).output == "shared (project, python)"


def tool(tool_id: str, origin: str, source: str = "CUSTOM") -> HostTool:
    return HostTool(tool_id, f"{tool_id} from {origin}", {}, origin, source, 0.0)


def test_a_chain_of_replacements_keeps_the_very_first_place(bun_host: ToolHost) -> None:
    # What a host returns for a.ts (x), b.ts (y), c.ts (x again), d.ts (x once more): x first, then y.
    tools = [tool("x", "/d.ts"), tool("y", "/b.ts")]
    notes = [LoadError("/c.ts", "tool x replaces the one from /a.ts"),
             LoadError("/d.ts", "tool x replaces the one from /c.ts"),
             LoadError("/b.ts", "tool y: minLength at /properties/p is not enforced")]
    order = {"/a.ts": 0, "/b.ts": 1, "/c.ts": 2, "/d.ts": 3, "/e.py": 4}
    python = [tool("w", "/e.py")]
    merged = merge_definitions([(bun_host, tools, notes), (bun_host, python, [])], order)
    assert [(t.id, t.origin) for t, _ in merged] == [("x", "/d.ts"), ("y", "/b.ts"), ("w", "/e.py")]


def test_notes_that_are_not_replacements_change_nothing(bun_host: ToolHost) -> None:
    tools = [tool("b", "/1.ts"), tool("a", "/2.ts")]
    notes = [LoadError("/2.ts", "tool a replaces the one from /unknown.ts"),  # not a file of this listing
             LoadError("/2.ts", "tool zz replaces the one from /0.ts"),  # not an id of this host
             LoadError("/1.ts", "export helper is not a tool definition; skipped")]
    merged = merge_definitions([(bun_host, tools, notes)], {"/0.ts": 0, "/1.ts": 1, "/2.ts": 2})
    assert [t.id for t, _ in merged] == ["b", "a"]
    assert merge_definitions([], {}) == []
