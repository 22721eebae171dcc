"""Custom tools written the way public projects write them (our own files under tests/plugin_fixtures/patterns,
one per pattern found in a survey of real `.opencode/tool*` and plugin files), end to end through the public
gRPC API in a real sandbox: ListTools ids, descriptions and JSON schemas, ExecuteTool outputs, metadata,
titles, errors and zod's validation messages."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from controlplane.client import ToolOutcome
from controlplane.v1 import tool_pb2
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parents[1] / "plugin_fixtures" / "patterns"
SCHEMA = "https://json-schema.org/draft/2020-12/schema"
RETRY = ".\nPlease rewrite the input so it satisfies the expected schema."
CONFIG = {"permission": {"deploy": {"*": "ask", "prod/*": "deny", "lab/*": "allow"}}}


def workspace() -> dict[str, str]:
    """The fixtures as a project's `.opencode` dir; `deps/` is the dir's installed node_modules."""
    files: dict[str, str] = {}
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file():
            relative = path.relative_to(FIXTURES).as_posix()
            if relative.startswith("deps/"):
                relative = "node_modules/" + relative.removeprefix("deps/")
            files[f".opencode/{relative}"] = path.read_text()
    files["README.md"] = "project\n"
    files[".git/HEAD"] = "ref: refs/heads/main\n"  # a git project: the worktree is the workspace
    return files


session_id = workspace_session(workspace(), config_json=json.dumps(CONFIG))


@pytest.fixture(scope="module")
async def listing(docker_plane: Plane, session_id: str) -> tool_pb2.ListToolsResponse:
    return await docker_plane.client.list_tools(session_id)


def custom(listing: tool_pb2.ListToolsResponse) -> dict[str, tool_pb2.ToolDefinition]:
    kinds = (tool_pb2.ToolDefinition.CUSTOM, tool_pb2.ToolDefinition.PLUGIN)
    return {t.id: t for t in listing.tools if t.source in kinds}


def schema_of(listing: tool_pb2.ListToolsResponse, tool: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(custom(listing)[tool].parameters_json_schema)
    return parsed


async def call(plane: Plane, session_id: str, tool: str, args: dict[str, Any] | str) -> ToolOutcome:
    return await plane.client.execute_tool(session_id, tool, args)


async def output_of(plane: Plane, session_id: str, tool: str, args: dict[str, Any]) -> str:
    out = await call(plane, session_id, tool, args)
    assert out.error is None, f"{tool}: {out.error}"
    return out.output


def result_metadata(out: ToolOutcome) -> dict[str, Any]:
    assert out.result is not None, out.error
    parsed: dict[str, Any] = json.loads(out.result.metadata_json)
    return parsed


# -- the registry: ids, sources, origins, descriptions -------------------------------------------


async def test_ids_follow_file_stems_sorted_exports_and_plugin_keys(listing: tool_pb2.ListToolsResponse) -> None:
    tools = custom(listing)
    glob = [t for t in listing.tools if t.id == "glob"]
    assert len(glob) == 1
    assert (glob[0].source, glob[0].description) == (tool_pb2.ToolDefinition.PLUGIN, "Project glob (plugin override)")
    ids = [t.id for t in listing.tools]
    assert ids.index("glob") == ids.index("grep") - 1  # in the built-in's place
    assert list(tools) == [
        "glob",  # a plugin tool replacing a built-in keeps the built-in's place
        # .opencode/tool/*.{js,ts}: one file after the other, each file's exports in code-unit order.
        "context-probe",
        "gatekeeper_careful", "gatekeeper_deploy", "gatekeeper_unscoped",
        "imports",
        "multi", "multi_flip", "multi_upper",
        "results_arrow", "results", "results_fail", "results_sync",
        "runtime",
        "shapes",
        # .opencode/tools/*: the .mjs file is not scanned; dated.ts and stale-record.ts fail to load.
        "legacy", "shelf",
        # plugin tools last, with their map keys verbatim; a module's plugin functions in export-name order.
        "logbook_ask", "kit_files", "kit-status", "kit_second",
    ]
    origin = "/workspace/.opencode"
    assert {t: d.origin for t, d in tools.items() if t.startswith("multi")} == dict.fromkeys(
        ["multi", "multi_flip", "multi_upper"], f"{origin}/tool/multi.ts",
    )
    assert tools["legacy"].origin == f"{origin}/tools/legacy.js"
    assert {t: d.source for t, d in tools.items() if t.startswith("kit")} == dict.fromkeys(
        ["kit_files", "kit-status", "kit_second"], tool_pb2.ToolDefinition.PLUGIN,
    )
    assert tools["kit_files"].origin == f"{origin}/plugin/toolkit.ts"
    # The same definition under two names is two tools with one description.
    assert tools["multi"].description == tools["multi_flip"].description == "Reverses a text"
    # A description computed at import time (template literal over a JSON import).
    assert tools["imports"].description == "Shows its imports (hello)"


async def test_files_that_cannot_be_tools_are_reported_alone(listing: tool_pb2.ListToolsResponse) -> None:
    errors = {e.origin: e.message for e in listing.load_errors}
    origin = "/workspace/.opencode/tools"
    assert set(errors) == {f"{origin}/dated.ts", f"{origin}/stale-record.ts"}
    assert errors[f"{origin}/dated.ts"] == "tool dated: Date cannot be represented in JSON Schema"
    assert errors[f"{origin}/stale-record.ts"].startswith("tool stale-record: ")


async def test_zod_features_become_the_json_schema_zod_gives(listing: tool_pb2.ListToolsResponse) -> None:
    assert schema_of(listing, "shapes") == {
        "$schema": SCHEMA, "type": "object",
        "properties": {
            "title": {"description": "A short title", "type": "string", "minLength": 2, "maxLength": 12},
            "mode": {"description": "How to run", "default": "fast", "type": "string", "enum": ["fast", "slow"]},
            "count": {"default": 2, "type": "integer", "minimum": 1, "maximum": 5},
            "tags": {"type": "array", "items": {"type": "string"}},
            "owner": {
                "type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                "required": ["name"], "additionalProperties": False,
            },
            "id": {"anyOf": [{"type": "string"}, {"type": "number"}]},
            "kind": {"type": "string", "const": "note"},
            "parent": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "slug": {"type": "string", "pattern": "^[a-z-]+$"},
            "labels": {
                "type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "string"},
            },
            "dryRun": {"default": False, "type": "boolean"},
        },
        "required": ["title", "mode", "count", "dryRun"], "additionalProperties": False,
    }
    assert schema_of(listing, "legacy")["properties"] == {
        "words": {"description": "Words to join", "type": "array", "items": {"type": "string"}, "minItems": 1},
        "separator": {"default": " ", "type": "string"},
    }
    assert schema_of(listing, "context-probe") == {
        "$schema": SCHEMA, "type": "object", "properties": {}, "additionalProperties": False,
    }
    assert schema_of(listing, "shelf") == {  # no `args` at all: an empty object, as upstream's z.object(undefined)
        "$schema": SCHEMA, "type": "object", "properties": {}, "additionalProperties": False,
    }
    assert schema_of(listing, "kit_files")["properties"] == {
        "limit": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9007199254740991},
    }
    assert schema_of(listing, "results")["properties"]["kind"]["enum"] == [
        "text", "empty", "number", "boolean", "nothing", "none", "list", "record", "full", "bare", "big", "chatty",
    ]


# -- arguments: parsing, defaults, coercion, validation errors --------------------------------------


async def test_defaults_and_coercions_reach_execute(docker_plane: Plane, session_id: str) -> None:
    out = await output_of(docker_plane, session_id, "shapes", {"title": "hi"})
    assert json.loads(out) == {"title": "hi", "mode": "fast", "count": 2, "dryRun": False}
    full = {
        "title": "report", "mode": "slow", "count": "4", "tags": ["a"], "owner": {"name": "ada"}, "id": 7,
        "kind": "note", "parent": None, "slug": "a-b", "labels": {"k": "v"}, "dryRun": True, "extra": {"kept": 1},
    }
    out = await output_of(docker_plane, session_id, "shapes", full)
    # `count` is coerced to a number; keys the schema does not declare are passed on as they came.
    assert json.loads(out) == {**full, "count": 4}
    assert await output_of(docker_plane, session_id, "legacy", {"words": ["a", "b"]}) == "a b"
    assert await output_of(docker_plane, session_id, "legacy", {"words": ["a", "b"], "separator": "+"}) == "a+b"


def invalid(tool: str, issues: list[dict[str, Any]]) -> str:
    return f"The {tool} tool was called with invalid arguments: {json.dumps(issues, indent=2)}{RETRY}"


async def test_validation_errors_carry_zods_issue_list(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "shapes", {"title": "x", "mode": "medium", "count": "9", "slug": "A B"})
    assert out.error == invalid("shapes", [
        {"origin": "string", "code": "too_small", "minimum": 2, "inclusive": True, "path": ["title"],
         "message": "Too small: expected string to have >=2 characters"},
        {"code": "invalid_value", "values": ["fast", "slow"], "path": ["mode"],
         "message": 'Invalid option: expected one of "fast"|"slow"'},
        {"origin": "number", "code": "too_big", "maximum": 5, "inclusive": True, "path": ["count"],
         "message": "Too big: expected number to be <=5"},
        {"origin": "string", "code": "invalid_format", "format": "regex", "pattern": "/^[a-z-]+$/", "path": ["slug"],
         "message": "Slug must be lowercase letters and dashes"},
    ])
    out = await call(docker_plane, session_id, "shapes", {"title": "ok", "owner": {"email": 3}, "kind": "memo"})
    assert out.error == invalid("shapes", [
        {"expected": "string", "code": "invalid_type", "path": ["owner", "name"],
         "message": "Invalid input: expected string, received undefined"},
        {"expected": "string", "code": "invalid_type", "path": ["owner", "email"],
         "message": "Invalid input: expected string, received number"},
        {"code": "invalid_value", "values": ["note"], "path": ["kind"], "message": 'Invalid input: expected "note"'},
    ])
    out = await call(docker_plane, session_id, "legacy", {"words": []})
    assert out.error == invalid("legacy", [
        {"origin": "array", "code": "too_small", "minimum": 1, "inclusive": True, "path": ["words"],
         "message": "Too small: expected array to have >=1 items"},
    ])
    out = await call(docker_plane, session_id, "kit_files", {"limit": 0})
    assert out.error == invalid("kit_files", [
        {"origin": "number", "code": "too_small", "minimum": 0, "inclusive": False, "path": ["limit"],
         "message": "Too small: expected number to be >0"},
    ])


# -- several tools per file, helpers, plain JS, plugins --------------------------------------------


async def test_every_tool_of_a_file_and_of_a_plugin_runs(docker_plane: Plane, session_id: str) -> None:
    assert await output_of(docker_plane, session_id, "multi", {"text": "abc"}) == "cba"
    assert await output_of(docker_plane, session_id, "multi_flip", {"text": "xy"}) == "yx"
    assert await output_of(docker_plane, session_id, "multi_upper", {"text": "abc"}) == "ABC"
    files = await output_of(docker_plane, session_id, "kit_files", {})
    assert files == "README.md (dir=/workspace tree=/workspace ctxdir=/workspace)"
    assert await output_of(docker_plane, session_id, "kit_files", {"limit": 0 + 1}) == files
    assert await output_of(docker_plane, session_id, "kit_second", {}) == "second"
    status = await call(docker_plane, session_id, "kit-status", {})
    assert (status.error, status.output) == (None, "all good")
    assert status.result is not None
    assert status.result.title == "status"
    assert result_metadata(status) == {"healthy": True, "truncated": False}


async def test_plugins_get_a_client_that_logs_and_answers_without_a_server(docker_plane: Plane,
                                                                           session_id: str) -> None:
    # Upstream hands plugins its SDK client; one that logs while starting must load here too.
    assert await output_of(docker_plane, session_id, "logbook_ask", {}) == (
        "toast=true sessions=none "
        "error=the OpenCode server API is not available to plugins in the sandbox (GET /session)"
    )


async def test_module_patterns_resolve_in_the_sandbox(docker_plane: Plane, session_id: str) -> None:
    out = await output_of(docker_plane, session_id, "imports", {"items": ["a", "b"]})
    assert out == "[hello]|b,kb,mb|3|2 items|true|top-level await|true|string"
    assert await output_of(docker_plane, session_id, "imports", {}) == (
        "[hello]|b,kb,mb|3|0 items|true|top-level await|true|string"
    )


# -- the ToolContext -------------------------------------------------------------------------------


async def test_context_fields(docker_plane: Plane, session_id: str) -> None:
    out = await docker_plane.client.execute_tool(session_id, "context-probe", {}, message_id="msg_probe",
                                                 call_id="call_probe_1")
    assert out.error is None, out.error
    assert json.loads(out.output) == {
        "sessionID": True, "messageID": "msg_probe", "callID": "call_probe_1", "agent": "build",
        "directory": "/workspace", "worktree": "/workspace",
        "aborted": False, "abortIsSignal": True, "metadataIsFunction": True, "askIsFunction": True,
        "messages": True, "cwd": "/workspace",
    }


async def test_ask_flows_to_the_client_and_follows_the_rules(docker_plane: Plane, session_id: str) -> None:
    seen: list[tuple[str, list[str], list[str], dict[str, Any]]] = []

    async def once(request: tool_pb2.PermissionRequest) -> tuple[int, str]:
        seen.append((request.permission, list(request.patterns), list(request.always),
                     json.loads(request.metadata_json)))
        return tool_pb2.PermissionReply.ONCE, ""

    out = await docker_plane.client.execute_tool(session_id, "gatekeeper_deploy", {"target": "stage/web"},
                                                 on_permission=once)
    assert (out.error, out.output) == (None, "deployed stage/web")
    assert seen == [("deploy", ["stage/web"], ["stage/*"], {"target": "stage/web"})]
    live = [(e.metadata.title, json.loads(e.metadata.metadata_json)) for e in out.events
            if e.WhichOneof("event") == "metadata"]
    assert live == [("deploying stage/web", {"target": "stage/web"})]
    assert out.result is not None
    assert (out.result.title, result_metadata(out)) == ("", {"truncated": False})

    # An allow rule answers without the client; a deny rule fails the call with upstream's text.
    assert await output_of(docker_plane, session_id, "gatekeeper_deploy", {"target": "lab/x"}) == "deployed lab/x"
    denied = await call(docker_plane, session_id, "gatekeeper_deploy", {"target": "prod/db"})
    assert denied.error == (
        "The user has specified a rule which prevents you from using this specific tool call. "
        # The whole ruleset (build's defaults, then the config's rules), as v1.2.27 lists it.
        'Here are some of the relevant rules [{"permission":"*","action":"allow","pattern":"*"},'
        '{"permission":"doom_loop","action":"ask","pattern":"*"},'
        '{"permission":"external_directory","pattern":"*","action":"ask"},'
        '{"permission":"external_directory","pattern":"/tmp/home/.local/share/opencode/tool-output/*","action":"allow"},'
        '{"permission":"question","action":"deny","pattern":"*"},{"permission":"plan_enter","action":"deny","pattern":"*"},'
        '{"permission":"plan_exit","action":"deny","pattern":"*"},{"permission":"read","pattern":"*","action":"allow"},'
        '{"permission":"read","pattern":"*.env","action":"ask"},{"permission":"read","pattern":"*.env.*","action":"ask"},'
        '{"permission":"read","pattern":"*.env.example","action":"allow"},'
        '{"permission":"question","action":"allow","pattern":"*"},{"permission":"plan_enter","action":"allow","pattern":"*"},'
        '{"permission":"deploy","pattern":"*","action":"ask"},'
        '{"permission":"deploy","pattern":"prod/*","action":"deny"},'
        '{"permission":"deploy","pattern":"lab/*","action":"allow"},'
        '{"permission":"external_directory","pattern":"/tmp/home/.local/share/opencode/tool-output/*","action":"allow"}]'
    )
    # With no patterns there is nothing to evaluate, so nothing is asked.
    assert len(seen) == 1
    out = await docker_plane.client.execute_tool(session_id, "gatekeeper_unscoped", {}, on_permission=once)
    assert (out.error, out.output, len(seen)) == (None, "nothing to ask", 1)


async def test_a_tool_may_catch_a_refused_ask(docker_plane: Plane, session_id: str) -> None:
    async def reject(_: tool_pb2.PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, "use staging"

    out = await docker_plane.client.execute_tool(session_id, "gatekeeper_careful", {"target": "stage/a"},
                                                 on_permission=reject)
    assert (out.error, out.output) == (
        None, "refused: The user rejected permission to use this specific tool call with the following feedback: "
              "use staging",
    )


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
    ("child", "sync,1000|async"),
    ("fetch", '200 {"path":"/probe"}'),
    ("env", '{"home":true,"path":true,"missing":"fallback"}'),
])
async def test_runtime_apis(docker_plane: Plane, session_id: str, use: str, output: str) -> None:
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
