"""Custom tools written the way public projects write them (our own files under tests/plugin_fixtures/patterns,
one per pattern found in a survey of real `.opencode/tool*` and plugin files), end to end through the public
gRPC API in a real sandbox: ListTools ids, descriptions and JSON schemas, arguments and zod's validation
messages, several tools per file, plugins, and the ToolContext (results, errors and runtime APIs are
test_custom_tools_pattern_results.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.v1 import tool_pb2
from tests.docker.custom_tools_support import (
    CONFIG,
    call,
    custom_tools,
    invalid,
    output_of,
    result_metadata,
    workspace,
)
from tests.planes import Plane, workspace_session

pytestmark = pytest.mark.docker

session_id = workspace_session(workspace(), config_json=json.dumps(CONFIG))


SCHEMA = "https://json-schema.org/draft/2020-12/schema"


@pytest.fixture(scope="module")
async def listing(docker_plane: Plane, session_id: str) -> tool_pb2.ListToolsResponse:
    return await docker_plane.client.list_tools(session_id)


def schema_of(listing: tool_pb2.ListToolsResponse, tool: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(custom_tools(listing)[tool].parameters_json_schema)
    return parsed


# -- the registry: ids, sources, origins, descriptions -------------------------------------------


async def test_ids_follow_file_stems_sorted_exports_and_plugin_keys(listing: tool_pb2.ListToolsResponse) -> None:
    tools = custom_tools(listing)
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
        # The rules of the requested permission (build's `*`, then the config's), as a v1.2.27 session lists them.
        'Here are some of the relevant rules [{"permission":"*","pattern":"*","action":"allow"},'
        '{"permission":"deploy","pattern":"*","action":"ask"},'
        '{"permission":"deploy","pattern":"prod/*","action":"deny"},'
        '{"permission":"deploy","pattern":"lab/*","action":"allow"}]'
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
