"""The custom-tool pattern fixtures (tests/plugin_fixtures/patterns) end to end through the public gRPC API in
a real sandbox, after the call: every kind of return value, thrown errors, runtime APIs, other spellings of
execute, truncation, abort reaching a child process, `always` answers, concurrent calls, arguments that are not
an object and plugin hooks around custom tools."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from controlplane.v1 import tool_pb2
from tests.docker.custom_tools_support import (
    CONFIG,
    call,
    output_of,
    result_metadata,
    workspace,
)
from tests.planes import Plane, workspace_session
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.docker

session_id = workspace_session(workspace(), config_json=json.dumps(CONFIG))


# -- results and errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "output"), [
    ("text", "plain text"), ("empty", ""), ("number", "42"), ("boolean", "false"), ("nothing", ""),
    ("none", "null"), ("list", '["a",1]'), ("record", '{"ok":true,"items":[1,2]}'), ("bare", "only output"),
    ("chatty", "printing did not disturb the result"),
])
async def test_every_kind_of_return_value(docker_plane: Plane, session_id: str, kind: str, output: str) -> None:
    out = await call(docker_plane, session_id, "results", {"kind": kind})
    assert (out.error, out.output) == (None, output)
    assert out.result is not None
    assert (out.result.title, result_metadata(out)) == ("", {"truncated": False})


async def test_a_full_result_keeps_its_title_and_metadata(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "results", {"kind": "full"})
    assert (out.error, out.output) == (None, "the output")
    assert out.result is not None
    assert (out.result.title, result_metadata(out)) == ("Done", {"rows": 3, "truncated": False})


@pytest.mark.parametrize(("how", "message"), [
    ("error", "the deploy key is missing"), ("type", "expected a list"), ("string", "plain string thrown"),
    ("object", "[object Object]"), ("async", "rejected later"),
])
async def test_thrown_errors_become_the_call_error(docker_plane: Plane, session_id: str, how: str,
                                                   message: str) -> None:
    out = await call(docker_plane, session_id, "results_fail", {"how": how})
    assert (out.result, out.error) == (None, message)


# -- runtime APIs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("use", "output"), [
    ("shell", "FROM BUN A B|/workspace|0"),
    ("shell-fail", "nothrow=3:oops throw=4"),
    ("files", "true|21|written by Bun.write"),
    ("node-fs", 'true|{"at":"node-fs-out.json"}'),
    ("child", "sync,{uid}|async"),  # the sandbox's own tool uid (controlplane/sandbox/tool_ids.py)
    ("fetch", '200 {"path":"/probe"}'),
    ("env", '{"home":true,"path":true,"missing":"fallback"}'),
])
async def test_runtime_apis(docker_plane: Plane, session_id: str, use: str, output: str) -> None:
    if "{uid}" in output:
        sandbox_id = (await docker_plane.client.get_session(session_id)).sandbox_id
        output = output.format(uid=tool_uid(docker_plane.instance, sandbox_id))
    assert await output_of(docker_plane, session_id, "runtime", {"use": use}) == output



async def test_execute_is_called_on_its_definition(docker_plane: Plane, session_id: str) -> None:
    # `this` inside execute is the definition object, as upstream calls `def.execute(args, ctx)`.
    assert await output_of(docker_plane, session_id, "shelf", {}) == "shelf: jar,tin (given {})"
    assert await output_of(docker_plane, session_id, "shelf", {"extra": 1}) == 'shelf: jar,tin (given {"extra":1})'


async def test_other_spellings_of_execute(docker_plane: Plane, session_id: str) -> None:
    assert await output_of(docker_plane, session_id, "results_sync", {"n": 4}) == "sync 8"
    assert await output_of(docker_plane, session_id, "results_arrow", {"n": 4}) == "arrow 5 for build"


async def test_a_plugin_tool_replaces_a_builtin(docker_plane: Plane, session_id: str) -> None:
    assert await output_of(docker_plane, session_id, "glob", {"pattern": "*.md"}) == "override saw *.md"


async def test_a_long_output_is_truncated_and_saved(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "results", {"kind": "big"})
    metadata = result_metadata(out)
    assert set(metadata) == {"truncated", "outputPath"}
    path = metadata["outputPath"]
    assert metadata["truncated"] is True
    assert re.fullmatch(r"/.+/tool_[0-9a-f]{12}[0-9A-Za-z]{14}", path), path
    lines = "\n".join(f"line {i}" for i in range(1, 2001))
    assert out.output == (
        f"{lines}\n\n...1 lines truncated...\n\nThe tool call succeeded but the output was truncated. "
        f"Full output saved to: {path}\nUse the Task tool to have explore agent process this file with Grep and Read "
        "(with offset/limit). Do NOT read the full file yourself - delegate to save context."
    )
    saved = await output_of(docker_plane, session_id, "read", {"filePath": path, "offset": 2000, "limit": 5})
    assert "2000: line 2000\n2001: line 2001\n" in saved


async def test_abort_reaches_a_child_process_through_the_signal(docker_plane: Plane, session_id: str) -> None:
    client = docker_plane.client
    stream, outbox = client.tool_call(session_id, "runtime", {"use": "child-abort"}, call_id="c-child-abort")
    final: tool_pb2.ToolEvent | None = None
    async for event in stream:
        kind = event.WhichOneof("event")
        if kind == "metadata" and event.metadata.title == "sleeping":
            await asyncio.sleep(0.2)
            outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="stop")))
        elif kind in ("result", "error"):
            final = event
            break
    outbox.put_nowait(None)
    assert final is not None
    assert (final.WhichOneof("event"), final.error.message) == ("error", "Tool execution aborted")
    for _ in range(50):
        ps = await client.run(session_id, ["ps", "-eo", "args="])
        if "sleep 30" not in ps.stdout.decode():
            break
        await asyncio.sleep(0.05)
    assert "sleep 30" not in ps.stdout.decode()


async def test_always_covers_later_calls_of_its_patterns(docker_plane: Plane, session_id: str) -> None:
    asked: list[list[str]] = []

    async def always(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        asked.append(list(request.patterns))
        return tool_pb2.PermissionReply.ALWAYS, ""

    client = docker_plane.client
    for target in ("qa/one", "qa/two"):
        out = await client.execute_tool(session_id, "gatekeeper_deploy", {"target": target}, on_permission=always)
        assert (out.error, out.output) == (None, f"deployed {target}")
    assert asked == [["qa/one"]]  # "always" stored qa/*, which allows qa/two without asking


async def test_concurrent_calls_of_custom_tools(docker_plane: Plane, session_id: str) -> None:
    texts = [f"t{i}" for i in range(6)]
    outs = await asyncio.gather(*(call(docker_plane, session_id, "multi_upper", {"text": t}) for t in texts))
    assert [(o.error, o.output) for o in outs] == [(None, t.upper()) for t in texts]


@pytest.mark.parametrize("raw", ["null", "[]", '"x"'])
async def test_arguments_that_are_not_an_object(docker_plane: Plane, session_id: str, raw: str) -> None:
    # The platform routes these to upstream's `invalid` tool before any hook or zod sees them.
    out = await call(docker_plane, session_id, "multi_upper", raw)
    assert out.result is not None
    assert (out.error, out.result.title, out.output) == (
        None, "Invalid Tool", "The arguments provided to the tool are invalid: "
        "Invalid input for tool multi_upper: the arguments must be a JSON object",
    )


async def test_project_plugin_hooks_around_custom_tools(docker_plane: Plane, session_id: str) -> None:
    assert await output_of(docker_plane, session_id, "multi_upper", {"text": "hook me"}) == "HOOKED"
    assert await output_of(docker_plane, session_id, "multi_upper", {"text": "left alone"}) == "LEFT ALONE"
    out = await docker_plane.client.execute_tool(session_id, "multi_flip", {"text": "ab"}, call_id="call_flip_1")
    assert (out.error, out.output) == (None, 'ba (after multi_flip, args {"text":"ab"}, call call_flip_1)')
