"""Every built-in tool through the real gRPC API against a real sandbox, compared byte for byte
with the reference (OpenCode v1.2.27 behaviour; see the project's docs for deliberate changes)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import pytest

from controlplane.client import AsyncClient, PermissionRequest, ToolOutcome, allow_once
from controlplane.v1 import tool_pb2
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

WS = "/workspace"
FILES = {
    "a.txt": "one\ntwo\nthree\n",
    "src/app.py": "def main():\n    print('hi')\n    return 0\n",
    "src/util.py": "VALUE = 1\n",
    "notes/readme.md": "# notes\n",
    "crlf.txt": "alpha\r\nbeta\r\n",
    "blob.bin": "x",
    ".env": "SECRET=1\n",
}


session_id = workspace_session(FILES)


async def call(plane: Plane, session: str, tool: str, args: Mapping[str, Any] | str, **kw: Any) -> ToolOutcome:
    return await plane.client.execute_tool(session, tool, args if isinstance(args, str) else dict(args), **kw)


def states(outcome: ToolOutcome) -> list[int]:
    return [e.state.status for e in outcome.events if e.WhichOneof("event") == "state"]


# -- read -------------------------------------------------------------------------------------------


async def test_read_envelope_and_footer(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/a.txt"})
    assert out.output == (
        f"<path>{WS}/a.txt</path>\n<type>file</type>\n<content>1: one\n2: two\n3: three\n\n"
        "(End of file - total 3 lines)\n</content>"
    )
    assert out.result is not None
    assert out.result.title == "workspace/a.txt"
    assert out.metadata == {"preview": "one\ntwo\nthree", "truncated": False, "loaded": []}
    assert states(out) == [tool_pb2.ToolState.PENDING, tool_pb2.ToolState.RUNNING, tool_pb2.ToolState.COMPLETED]


async def test_read_paging_and_relative_path(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": "a.txt", "offset": 2, "limit": 1})
    assert out.output == (
        f"<path>{WS}/a.txt</path>\n<type>file</type>\n<content>2: two\n\n"
        "(Showing lines 2-2 of 3. Use offset=3 to continue.)\n</content>"
    )
    bad = await call(docker_plane, session_id, "read", {"filePath": "a.txt", "offset": 9})
    assert bad.error == "Offset 9 is out of range for this file (3 lines)"


async def test_read_missing_file_suggests(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/src/app"})
    assert out.error == f"File not found: {WS}/src/app\n\nDid you mean one of these?\n{WS}/src/app.py"


async def test_read_directory(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/src"})
    assert out.output == (
        f"<path>{WS}/src</path>\n<type>directory</type>\n<entries>\napp.py\nutil.py\n\n(2 entries)\n</entries>"
    )


async def test_read_binary_is_refused(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/blob.bin"})
    assert out.error == f"Cannot read binary file: {WS}/blob.bin"


async def test_read_validation_message_is_upstreams(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {})
    assert out.error is not None
    assert out.error.startswith("The read tool was called with invalid arguments: [\n")
    assert '"path": [\n      "filePath"\n    ]' in out.error
    assert out.error.endswith("].\nPlease rewrite the input so it satisfies the expected schema.")


async def test_reading_env_file_asks_and_reject_fails(docker_plane: Plane, session_id: str) -> None:
    seen: list[PermissionRequest] = []

    async def reject(request: PermissionRequest) -> tuple[int, str]:
        seen.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/.env"}, on_permission=reject)
    assert out.error == "The user rejected permission to use this specific tool call."
    assert [(r.permission, list(r.patterns), list(r.always)) for r in seen] == [("read", [f"{WS}/.env"], ["*"])]

    async def feedback(request: PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, "use the example file"

    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/.env"}, on_permission=feedback)
    assert out.error == (
        "The user rejected permission to use this specific tool call with the following feedback: "
        "use the example file"
    )
    ok = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/.env"}, on_permission=allow_once)
    assert "1: SECRET=1" in ok.output


# -- write / edit / multiedit -----------------------------------------------------------------------


async def test_write_requires_a_read_first_and_edit_replaces(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/src/util.py"
    out = await call(docker_plane, session_id, "write", {"filePath": path, "content": "VALUE = 2\n"})
    assert out.error == f"You must read file {path} before overwriting it. Use the Read tool first"
    await call(docker_plane, session_id, "read", {"filePath": path})
    change = {"filePath": path, "oldString": "VALUE = 1", "newString": "VALUE = 3"}
    out = await call(docker_plane, session_id, "edit", change)
    assert out.output == "Edit applied successfully."
    assert out.metadata["filediff"]["additions"] == 1
    assert out.metadata["filediff"]["deletions"] == 1
    asks = [(r.permission, list(r.patterns)) for r in out.permission_requests]
    assert asks == []  # build agent allows edit without asking
    again = await call(docker_plane, session_id, "read", {"filePath": path})
    assert "1: VALUE = 3" in again.output


async def test_edit_errors_are_exact(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/src/app.py"
    same = await call(docker_plane, session_id, "edit", {"filePath": path, "oldString": "x", "newString": "x"})
    assert same.error == "No changes to apply: oldString and newString are identical."
    await call(docker_plane, session_id, "read", {"filePath": path})
    missing = await call(docker_plane, session_id, "edit", {"filePath": path, "oldString": "nothere", "newString": "y"})
    assert missing.error == (
        "Could not find oldString in the file. It must match exactly, including whitespace, indentation, "
        "and line endings."
    )
    nope = {"filePath": f"{WS}/nope.py", "oldString": "a", "newString": "b"}
    gone = await call(docker_plane, session_id, "edit", nope)
    assert gone.error == f"File {WS}/nope.py not found"


async def test_edit_line_trimmed_match_and_crlf_kept(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/src/app.py"
    await call(docker_plane, session_id, "read", {"filePath": path})
    out = await call(docker_plane, session_id, "edit", {
        "filePath": path, "oldString": "print('hi')  \n  return 0", "newString": "    print('bye')\n    return 1",
    })
    assert out.output == "Edit applied successfully."
    text = await call(docker_plane, session_id, "read", {"filePath": path})
    assert "2:     print('bye')\n3:     return 1" in text.output
    crlf = f"{WS}/crlf.txt"
    await call(docker_plane, session_id, "read", {"filePath": crlf})
    await call(docker_plane, session_id, "edit", {"filePath": crlf, "oldString": "beta", "newString": "gamma\ndelta"})
    raw = await docker_plane.client.run(session_id, ["cat", crlf])
    assert raw.stdout == b"alpha\r\ngamma\r\ndelta\r\n"


async def test_multiedit_is_atomic(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/notes/readme.md"
    await call(docker_plane, session_id, "read", {"filePath": path})
    out = await call(docker_plane, session_id, "multiedit", {"filePath": path, "edits": [
        {"filePath": path, "oldString": "# notes", "newString": "# Notes"},
        {"filePath": path, "oldString": "absent", "newString": "x"},
    ]})
    assert out.error is not None
    assert out.error.startswith("Could not find oldString")
    raw = await docker_plane.client.run(session_id, ["cat", path])
    assert raw.stdout == b"# notes\n"


# -- apply_patch ------------------------------------------------------------------------------------


async def test_apply_patch_add_update_delete(docker_plane: Plane, session_id: str) -> None:
    setup = f"printf 'x\\ny\\nz\\n' > {WS}/p.txt; echo bye > {WS}/gone.txt"
    await docker_plane.client.run(session_id, ["sh", "-c", setup])
    patch = (
        "*** Begin Patch\n*** Add File: added/new.txt\n+hello\n+world\n"
        "*** Update File: p.txt\n@@\n x\n-y\n+Y\n z\n"
        "*** Delete File: gone.txt\n*** End Patch"
    )
    out = await call(docker_plane, session_id, "apply_patch", {"patchText": patch})
    assert out.output == (
        "Success. Updated the following files:\nA workspace/added/new.txt\nM workspace/p.txt\nD workspace/gone.txt"
    )
    check = f"cat {WS}/added/new.txt {WS}/p.txt; ls {WS}/gone.txt"
    raw = await docker_plane.client.run(session_id, ["sh", "-c", check])
    assert raw.stdout == b"hello\nworld\nx\nY\nz\n"
    assert raw.exit_code != 0
    empty = await call(docker_plane, session_id, "apply_patch", {"patchText": "*** Begin Patch\n*** End Patch"})
    assert empty.error == "patch rejected: empty patch"
    bad = await call(docker_plane, session_id, "apply_patch", {"patchText": "nothing"})
    assert bad.error == "apply_patch verification failed: Error: Invalid patch format: missing Begin/End markers"


# -- glob / grep / list -----------------------------------------------------------------------------


async def test_glob_grep_list_formats(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "glob", {"pattern": "*.py", "path": f"{WS}/src"})
    assert sorted(out.output.split("\n")) == [f"{WS}/src/app.py", f"{WS}/src/util.py"]
    assert out.metadata == {"count": 2, "truncated": False}
    none = await call(docker_plane, session_id, "glob", {"pattern": "*.nothing"})
    assert none.output == "No files found"
    grep = await call(docker_plane, session_id, "grep", {"pattern": "^alpha", "path": WS})
    assert grep.output == f"Found 1 matches\n{WS}/crlf.txt:\n  Line 1: alpha"
    invalid = await call(docker_plane, session_id, "grep", {"pattern": "(", "path": WS})
    assert invalid.output == "No files found"
    listing = await call(docker_plane, session_id, "list", {"path": f"{WS}/src"})
    assert listing.output == f"{WS}/src/\n  app.py\n  util.py\n"


# -- truncation -------------------------------------------------------------------------------------


async def test_large_output_is_truncated_and_saved_where_read_reaches(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "bash", {"command": "seq 1 2500", "description": "Count"})
    meta = out.metadata
    assert meta["truncated"] is True
    path = meta["outputPath"]
    assert path.startswith("/tmp/home/.local/share/opencode/tool-output/tool_")
    head = "\n".join(str(i) for i in range(1, 2001))
    assert out.output == (
        f"{head}\n\n...501 lines truncated...\n\nThe tool call succeeded but the output was truncated. "
        f"Full output saved to: {path}\nUse the Task tool to have explore agent process this file with Grep "
        "and Read (with offset/limit). Do NOT read the full file yourself - delegate to save context."
    )
    saved = await call(docker_plane, session_id, "read", {"filePath": path, "offset": 2500, "limit": 5})
    assert "2500: 2500" in saved.output
    assert saved.permission_requests == []
    grep = await call(docker_plane, session_id, "grep", {"pattern": "^2499$", "path": path.rsplit("/", 1)[0]})
    assert "Line 2499: 2499" in grep.output


# -- bash -------------------------------------------------------------------------------------------


async def test_bash_output_and_metadata(docker_plane: Plane, session_id: str) -> None:
    args = {"command": "echo hello; echo oops >&2; exit 3", "description": "Say hello"}
    out = await call(docker_plane, session_id, "bash", args)
    assert out.output == "hello\noops\n"
    assert out.result is not None
    assert out.result.title == "Say hello"
    assert out.metadata == {"output": "hello\noops\n", "exit": 3, "description": "Say hello", "truncated": False}
    asks = [(r.permission, list(r.patterns), list(r.always)) for r in out.permission_requests]
    assert asks == []


async def test_bash_timeout_text(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "bash", {"command": "sleep 5", "timeout": 300, "description": "Wait"})
    assert out.output == (
        "\n\n<bash_metadata>\nbash tool terminated command after exceeding timeout 300 ms\n</bash_metadata>"
    )
    assert out.metadata["exit"] is None


async def test_bash_returns_when_foreground_exits(docker_plane: Plane, session_id: str) -> None:
    started = time.monotonic()
    out = await call(docker_plane, session_id, "bash", {"command": "sleep 1000 & echo done", "description": "Bg"})
    assert out.output == "done\n"
    assert time.monotonic() - started < 5


async def _abort_leaves_nothing(docker_plane: Plane, session_id: str, how: str) -> None:
    marker = f"marker{how}"
    seconds = 3000 + len(how)  # unique per test: other tests leave their own background sleeps
    stream, outbox = docker_plane.client.tool_call(
        session_id, "bash",
        {"command": f"sleep {seconds} & sleep {seconds} & echo {marker}; wait", "description": "Hang"},
        call_id=f"call_{how}",
    )
    result: tool_pb2.ToolResult | None = None
    async for event in stream:
        kind = event.WhichOneof("event")
        if kind == "metadata" and marker in event.metadata.metadata_json:
            if how == "message":
                outbox.put_nowait(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="stop")))
            else:
                assert await docker_plane.client.cancel_tool_call(session_id, f"call_{how}")
        elif kind == "result":
            result = event.result
            break
    outbox.put_nowait(None)
    assert result is not None
    assert result.output == f"{marker}\n\n\n<bash_metadata>\nUser aborted the command\n</bash_metadata>"
    ps = await docker_plane.client.run(session_id, ["ps", "-eo", "args"])
    assert f"sleep {seconds}".encode() not in ps.stdout


async def test_abort_by_message_kills_the_group(docker_plane: Plane, session_id: str) -> None:
    await _abort_leaves_nothing(docker_plane, session_id, "message")


async def test_cancel_tool_call_kills_the_group(docker_plane: Plane, session_id: str) -> None:
    await _abort_leaves_nothing(docker_plane, session_id, "cancel")


async def test_rpc_cancellation_kills_the_group(docker_plane: Plane, session_id: str) -> None:
    stream, _outbox = docker_plane.client.tool_call(
        session_id, "bash", {"command": "sleep 1002 & echo up; wait", "description": "Hang"},
    )
    async for event in stream:
        if event.WhichOneof("event") == "metadata" and "up" in event.metadata.metadata_json:
            break
    stream.cancel()
    for _ in range(50):
        ps = await docker_plane.client.run(session_id, ["ps", "-eo", "args"])
        if b"sleep 1002" not in ps.stdout:
            break
        await asyncio.sleep(0.1)
    assert b"sleep 1002" not in ps.stdout


async def test_calls_run_in_parallel(docker_plane: Plane, session_id: str) -> None:
    slow = asyncio.ensure_future(call(docker_plane, session_id, "bash", {"command": "sleep 2", "description": "Slow"}))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    quick = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/a.txt"})
    assert quick.result is not None
    assert time.monotonic() - started < 1.5
    assert not slow.done()
    await slow


# -- registry and invalid ---------------------------------------------------------------------------


async def test_list_tools_order_and_model_filter(docker_plane: Plane, session_id: str) -> None:
    claude = await docker_plane.client.list_tools(session_id, provider_id="anthropic", model_id="claude-sonnet-4")
    assert [t.id for t in claude.tools] == [
        "question", "bash", "read", "glob", "grep", "edit", "write", "task", "webfetch", "todowrite", "skill",
    ]
    gpt = await docker_plane.client.list_tools(session_id, provider_id="openai", model_id="gpt-5")
    assert [t.id for t in gpt.tools] == [
        "question", "bash", "read", "glob", "grep", "task", "webfetch", "todowrite", "skill", "apply_patch",
    ]
    zen = await docker_plane.client.list_tools(session_id, provider_id="opencode", model_id="claude-sonnet-4")
    assert [t.id for t in zen.tools] == [
        "question", "bash", "read", "glob", "grep", "edit", "write", "task", "webfetch", "todowrite", "websearch",
        "codesearch", "skill",
    ]
    read = next(t for t in claude.tools if t.id == "read")
    schema = json.loads(read.parameters_json_schema)
    assert schema["required"] == ["filePath"]
    assert set(schema["properties"]) == {"filePath", "offset", "limit"}
    assert "/workspace" in next(t for t in claude.tools if t.id == "bash").description


async def test_unknown_tool_goes_through_invalid(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "frobnicate", {"x": 1})
    assert out.result is not None
    assert out.result.title == "Invalid Tool"
    assert out.output.startswith(
        "The arguments provided to the tool are invalid: Model tried to call unavailable tool 'frobnicate'."
    )


async def test_client_of_another_tenant_cannot_call(docker_plane: Plane, session_id: str) -> None:
    stranger = AsyncClient(docker_plane.plane.address, "not-a-token")
    with pytest.raises(Exception, match=r"(?i)unauthenticated"):
        await stranger.execute_tool(session_id, "read", {"filePath": "a.txt"})
    await stranger.close()
