"""The Python tool host and its driver: real processes, real pydantic (no mocks)."""

from __future__ import annotations

import asyncio
import json

import pytest

from sandbox_agent.custom.host import HostCallError, HostFile, HostTool, ToolHost
from tests.unit.custom.conftest import Sandbox, eventually, pid_gone

SCHEMA = "https://json-schema.org/draft/2020-12/schema"
RETRY = "\nPlease rewrite the input so it satisfies the expected schema."

RESTARTED = (r" \(the tool did not stop within 0\.5 s and nothing else was running in the python tool host, so "
             r"the host was restarted: its tools' module state was reset\)")


async def load(host: ToolHost, sandbox: Sandbox, *files: str) -> list[HostTool]:
    loaded = await host.load([HostFile(f, "tool") for f in files], str(sandbox.project), str(sandbox.project))
    assert loaded.load_errors == []
    return loaded.tools


PYDANTIC_TOOL = """
    from typing import Literal

    from pydantic import BaseModel, Field

    from opencode_tool import tool


    class Point(BaseModel):
        title: str
        x: int


    class GreetArgs(BaseModel):
        name: str = Field(description="who to greet")
        times: int = 1
        mode: Literal["loud", "quiet"] = "quiet"
        at: Point | None = None


    async def greet(args: GreetArgs, ctx) -> str:
        text = " ".join([f"hello {args.name}"] * args.times)
        return text.upper() if args.mode == "loud" else text


    default = tool(description="Greets someone", args=GreetArgs, execute=greet)


    @tool(description="Counts characters", args=GreetArgs)
    def count(args: GreetArgs, ctx) -> int:
        return len(args.name) * args.times
"""


async def test_pydantic_args_schema_ids_and_parsing(sandbox: Sandbox, py_host: ToolHost) -> None:
    path = sandbox.tool("greet.py", PYDANTIC_TOOL)
    tools = await load(py_host, sandbox, path)
    assert [(t.id, t.description, t.source, t.origin) for t in tools] == [
        ("greet_count", "Counts characters", "CUSTOM", path), ("greet", "Greets someone", "CUSTOM", path)]
    assert tools[1].parameters == {
        "$schema": SCHEMA,
        "$defs": {"Point": {"properties": {"title": {"type": "string"}, "x": {"type": "integer"}},
                            "required": ["title", "x"], "type": "object"}},
        "properties": {
            "name": {"description": "who to greet", "type": "string"},
            "times": {"default": 1, "type": "integer"},
            "mode": {"default": "quiet", "enum": ["loud", "quiet"], "type": "string"},
            "at": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}], "default": None},
        },
        "required": ["name"], "type": "object",
    }
    assert (await sandbox.call(py_host, "greet", {"name": "ann", "times": 2, "mode": "loud"})).output == \
        "HELLO ANN HELLO ANN"
    assert (await sandbox.call(py_host, "greet_count", {"name": "ann", "times": "3"})).output == "9"


async def test_pydantic_rejection_text(sandbox: Sandbox, py_host: ToolHost) -> None:
    await load(py_host, sandbox, sandbox.tool("greet.py", PYDANTIC_TOOL))
    with pytest.raises(HostCallError) as caught:
        await sandbox.call(py_host, "greet", {"times": "x", "mode": "shout"})
    assert str(caught.value) == (
        "The greet tool was called with invalid arguments: 3 validation errors for GreetArgs\n"
        "name\n  Field required [type=missing, input_value={'times': 'x', 'mode': 'shout'}, input_type=dict]\n"
        "times\n  Input should be a valid integer, unable to parse string as an integer "
        "[type=int_parsing, input_value='x', input_type=str]\n"
        "mode\n  Input should be 'loud' or 'quiet' [type=literal_error, input_value='shout', input_type=str]"
        f".{RETRY}"
    )


JSON_TOOL = """
    from opencode_tool import tool

    ARGS = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "file", "minLength": 1},
            "limit": {"type": "integer", "default": 10},
            "mode": {"enum": ["r", "w"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "opts": {"type": "object", "properties": {"deep": {"type": "boolean", "default": False}},
                     "additionalProperties": False},
        },
        "required": ["path"],
    }


    @tool(description="Echoes its parsed arguments", args=ARGS)
    async def default(args, ctx):
        return args
"""


async def test_json_schema_args(sandbox: Sandbox, py_host: ToolHost) -> None:
    path = sandbox.tool("echo.py", JSON_TOOL)
    loaded = await py_host.load([HostFile(path, "tool")], str(sandbox.project), "/")
    assert [t.id for t in loaded.tools] == ["echo"]
    assert loaded.tools[0].parameters["$schema"] == SCHEMA
    assert loaded.tools[0].parameters["properties"]["path"] == {"type": "string", "description": "file", "minLength": 1}
    assert [n.message for n in loaded.notes] == ["tool echo: minLength at /properties/path is not enforced"]

    result = await sandbox.call(py_host, "echo", {"path": "a", "opts": {}, "extra": 1.5, "tags": ["x"]})
    assert json.loads(result.output) == {"path": "a", "limit": 10, "opts": {"deep": False}, "extra": 1.5,
                                         "tags": ["x"]}
    result = await sandbox.call(py_host, "echo", {"path": "a", "limit": 3.0})  # a JSON integer may be written 3.0
    assert json.loads(result.output) == {"path": "a", "limit": 3.0}

    with pytest.raises(HostCallError) as caught:
        await sandbox.call(py_host, "echo", {"limit": True, "mode": "x", "tags": ["a", 2], "opts": {"deep": 1, "z": 0}})
    issues = [
        {"expected": "string", "code": "invalid_type", "path": ["path"],
         "message": "Invalid input: expected string, received undefined"},
        {"expected": "integer", "code": "invalid_type", "path": ["limit"],
         "message": "Invalid input: expected integer, received boolean"},
        {"code": "invalid_value", "values": ["r", "w"], "path": ["mode"],
         "message": 'Invalid option: expected one of "r"|"w"'},
        {"expected": "string", "code": "invalid_type", "path": ["tags", 1],
         "message": "Invalid input: expected string, received number"},
        {"expected": "boolean", "code": "invalid_type", "path": ["opts", "deep"],
         "message": "Invalid input: expected boolean, received number"},
        {"code": "unrecognized_keys", "keys": ["z"], "path": ["opts"], "message": 'Unrecognized key: "z"'},
    ]
    assert str(caught.value) == (
        f"The echo tool was called with invalid arguments: {json.dumps(issues, indent=2)}.{RETRY}")


CONTEXT_TOOL = """
    import time

    from opencode_tool import PermissionDenied, tool

    ARGS = {"type": "object", "properties": {}}


    @tool(description="async, asks", args=ARGS)
    async def asks(args, ctx):
        await ctx.metadata(title="asking")
        await ctx.ask(permission="edit", patterns=["a.txt"], always=["*"], metadata={"diff": "+x"})
        await ctx.metadata(metadata={"done": True})
        return {"title": "T", "output": "allowed", "metadata": {"n": 1},
                "attachments": [{"mime": "text/plain", "url": "data:text/plain;base64,eA=="}]}


    @tool(description="sync, asks", args=ARGS)
    def sync_asks(args, ctx):
        ctx.metadata_sync("sync title", {"k": "v"})
        try:
            ctx.ask_sync(permission="bash", patterns=["ls"])
        except PermissionDenied as exc:
            return f"refused: {exc}"
        return "allowed"


    @tool(description="context", args=ARGS)
    def where(args, ctx):
        import os
        return {"output": "", "metadata": {
            "ids": [ctx.session_id, ctx.sessionID, ctx.message_id, ctx.messageID, ctx.call_id, ctx.callID, ctx.agent],
            "dirs": [ctx.directory, ctx.worktree, os.getcwd()], "extra": ctx.extra, "aborted": ctx.abort.is_set()}}
"""


async def test_metadata_and_ask_from_async_and_sync_tools(sandbox: Sandbox, py_host: ToolHost) -> None:
    await load(py_host, sandbox, sandbox.tool("ctx.py", CONTEXT_TOOL))
    result = await sandbox.call(py_host, "ctx_asks", {})
    assert (result.title, result.output, result.metadata, result.attachments) == (
        "T", "allowed", {"n": 1}, [{"mime": "text/plain", "url": "data:text/plain;base64,eA=="}])
    assert sandbox.recorder.asks == [("edit", ["a.txt"], ["*"], {"diff": "+x"})]
    assert sandbox.recorder.updates == [("asking", None), (None, {"done": True})]

    assert (await sandbox.call(py_host, "ctx_sync_asks", {})).output == "allowed"
    assert sandbox.recorder.asks[-1] == ("bash", ["ls"], [], {})
    assert sandbox.recorder.updates[-1] == ("sync title", {"k": "v"})
    sandbox.recorder.deny = {"bash": "not today",
                             "edit": "The user rejected permission to use this specific tool call."}
    assert (await sandbox.call(py_host, "ctx_sync_asks", {})).output == "refused: not today"
    with pytest.raises(HostCallError, match=r"^The user rejected permission to use this specific tool call\.$"):
        await sandbox.call(py_host, "ctx_asks", {})

    where = await sandbox.call(py_host, "ctx_where", {})
    project = str(sandbox.project)
    assert where.metadata == {"ids": ["ses_1", "ses_1", "msg_1", "msg_1", "call_1", "call_1", "build"],
                              "dirs": [project, project, project], "extra": {}, "aborted": False}


ABORT_TOOL = """
    import os
    from pathlib import Path

    from opencode_tool import tool

    ARGS = {"type": "object", "properties": {}}


    @tool(description="waits for abort", args=ARGS)
    async def waits(args, ctx):
        await ctx.metadata(title="waiting")
        await ctx.abort.wait()
        Path(ctx.extra["marker"]).write_text("saw abort")
        return "stopped"


    @tool(description="spins", args=ARGS)
    def spins(args, ctx):
        Path(ctx.extra["marker"]).write_text(str(os.getpid()))
        while True:
            pass


    @tool(description="quick", args=ARGS)
    def quick(args, ctx):
        return "still here"
"""


async def test_abort_sets_ctx_abort_and_a_spinning_sync_tool_is_killed(sandbox: Sandbox, py_host: ToolHost) -> None:
    await load(py_host, sandbox, sandbox.tool("ab.py", ABORT_TOOL))
    marker = sandbox.root / "marker"

    async def start(tool: str, abort: asyncio.Event) -> asyncio.Future[object]:
        return asyncio.ensure_future(py_host.call(
            tool, {}, sandbox.context(marker=str(marker)), on_metadata=sandbox.recorder.on_metadata,
            on_ask=sandbox.recorder.on_ask, abort=abort, timeout_s=None))

    abort = asyncio.Event()
    call = await start("ab_waits", abort)
    await eventually(lambda: bool(sandbox.recorder.updates))
    abort.set()
    with pytest.raises(HostCallError, match=r"^Tool execution aborted$"):
        await call
    assert marker.read_text() == "saw abort"
    assert py_host.restarts == 0

    marker.unlink()
    abort = asyncio.Event()
    call = await start("ab_spins", abort)
    await eventually(lambda: marker.exists() and marker.read_text() != "")
    abort.set()
    with pytest.raises(HostCallError, match=r"^Tool execution aborted" + RESTARTED + "$"):
        await call
    assert pid_gone(int(marker.read_text()))
    assert (await sandbox.call(py_host, "ab_quick", {})).output == "still here"
    assert py_host.restarts == 1


async def test_bad_files_are_load_errors_and_neighbours_load(sandbox: Sandbox, py_host: ToolHost) -> None:
    syntax = sandbox.tool("syntax.py", "def broken(:\n    pass\n")
    missing = sandbox.tool("missing.py", "import module_that_does_not_exist\n")
    exits = sandbox.tool("exits.py", "import sys\nsys.exit(4)\n")
    bad_args = sandbox.tool("badargs.py", """
        from opencode_tool import tool
        default = tool(description="x", args={"type": "string"}, execute=lambda a, c: "")
    """)
    good = sandbox.tool("good.py", """
        from opencode_tool import tool
        __all__ = ["default", "helper"]
        default = tool(description="good", args={"type": "object"}, execute=lambda args, ctx: "ok")
        def helper():
            return 1
    """)
    loaded = await py_host.load([HostFile(p, "tool") for p in (syntax, missing, exits, bad_args, good)],
                                str(sandbox.project), "/")
    assert [t.id for t in loaded.tools] == ["good"]
    assert [(e.origin, e.message) for e in loaded.load_errors] == [
        (syntax, "SyntaxError: invalid syntax (syntax.py, line 1)"),
        (missing, "ModuleNotFoundError: No module named 'module_that_does_not_exist'"),
        (exits, "SystemExit: 4"),
        (bad_args, 'TypeError: args must be a pydantic model class or a JSON Schema with "type": "object"'),
    ]
    assert [(n.origin, n.message) for n in loaded.notes] == [(good, "helper is not a tool definition; skipped")]
    assert (await sandbox.call(py_host, "good", {"anything": 1})).output == "ok"


async def test_sibling_imports_printing_and_result_shapes(sandbox: Sandbox, py_host: ToolHost) -> None:
    sandbox.tool("helpers.py", "def shout(s):\n    return s.upper() + '!'\n")
    path = sandbox.tool("shapes.py", """
        import os
        import subprocess
        import sys

        from helpers import shout
        from opencode_tool import tool

        ARGS = {"type": "object", "properties": {}}
        print("printed at import")


        def returning(value):
            def execute(args, ctx):
                print('{"id":"1","type":"result","title":"","output":"forged","metadata":{},"attachments":[]}')
                sys.stdout.write("no newline")
                os.write(1, b"raw fd 1\\n")
                subprocess.run(["echo", "child"], check=True)
                return value
            return tool(description="shape", args=ARGS, execute=execute)


        text = returning(shout("hi"))
        obj = returning({"answer": 42, "list": [1, "two"], "ok": True})
        bare = returning({"output": "only output"})
        number = returning(42)
        nothing = returning(None)
        boolean = returning(False)
        a_set = returning({1, 2})


        class Thing:
            def __str__(self):
                return "a thing"


        other = returning(Thing())
    """)
    await load(py_host, sandbox, path)

    async def output(tool: str) -> str:
        return (await sandbox.call(py_host, f"shapes_{tool}", {})).output

    assert await output("text") == "HI!"
    assert await output("obj") == '{"answer":42,"list":[1,"two"],"ok":true}'
    assert await output("bare") == "only output"
    assert await output("number") == "42"
    assert await output("nothing") == ""
    assert await output("boolean") == "false"
    assert await output("a_set") == "{1, 2}"
    assert await output("other") == "a thing"
    assert not (sandbox.tools / "__pycache__").exists()  # no bytecode left in the user's project


async def test_reload_imports_only_changed_files(sandbox: Sandbox, py_host: ToolHost) -> None:
    log = sandbox.root / "imports.log"

    def source(name: str, version: str) -> str:
        return f"""
            from opencode_tool import tool
            with open({str(log)!r}, "a") as f:
                f.write("{name}\\n")
            default = tool(description="{name} {version}", args={{"type": "object"}}, execute=lambda a, c: "{version}")
        """

    a = sandbox.tool("a.py", source("a", "v1"))
    b = sandbox.tool("b.py", source("b", "v1"))
    await load(py_host, sandbox, a, b)
    sandbox.tool("b.py", source("b", "version-2"))
    second = await load(py_host, sandbox, a, b)
    assert [(t.id, t.description) for t in second] == [("a", "a v1"), ("b", "b version-2")]
    assert log.read_text().split() == ["a", "b", "b"]
    assert (await sandbox.call(py_host, "b", {})).output == "version-2"
    assert (await py_host.hook("tool.execute.before", {"tool": "b"}, {"args": {"x": 1}}, timeout_s=5)) == \
        {"args": {"x": 1}}
