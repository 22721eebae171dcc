"""Every tool's arguments fuzzed on the local plane: malformed JSON and wrong shapes, huge payloads,
and paths that climb out of the workspace (permission asks are rejected): an error or a result, no
hang, nothing outside changed or shown, and a refused call leaves the workspace as it was."""

from __future__ import annotations

import json
import os

import grpc
import pytest
from hypothesis import strategies as st

from tests.fuzz.harness import (
    MESSAGE_CAP_MB,
    FuzzPlane,
    assert_clear,
    drive_tool_call,
    run_given,
    snapshot,
    tool_call,
)
from tests.fuzz.strategies import hostile_text, malformed_json

SKIPPED = {"websearch", "codesearch", "task", "batch"}
"""Reach an outside search API, or start child sessions / other tools (fuzzed through their own tests)."""
PATH_ARGS = {
    "read": ("filePath", {}),
    "list": ("path", {}),
    "glob": ("path", {"pattern": "*"}),
    "grep": ("path", {"pattern": "o"}),
    "write": ("filePath", {"content": "pwned\n"}),
    "edit": ("filePath", {"oldString": "one", "newString": "pwned"}),
}


async def _tools(fp: FuzzPlane) -> list[str]:
    listed = [t.id for t in (await fp.client.list_tools(fp.live)).tools]
    return [t for t in listed if t not in SKIPPED]


async def test_every_tool_survives_malformed_arguments(fplane: FuzzPlane) -> None:
    tools = await _tools(fplane)
    assert {"bash", "read", "write", "edit", "glob", "grep"} <= set(tools)
    # Wrong shapes only: a fuzzed object never has the right keys, so nothing runs for real.
    args = st.one_of(malformed_json, st.dictionaries(hostile_text, st.integers() | hostile_text).map(json.dumps))

    async def check(value: tuple[str, str]) -> None:
        tool, args_json = value
        before = await snapshot(fplane)
        outcome = await drive_tool_call(fplane, [tool_call(fplane.live, tool, args_json)])
        assert_clear(outcome)
        assert outcome.code == (grpc.StatusCode.OK if tool else grpc.StatusCode.INVALID_ARGUMENT), outcome.details
        after = await snapshot(fplane)
        assert (after.workspace, after.outside, after.sessions) == (before.workspace, before.outside, before.sessions)

    await run_given(st.tuples(st.sampled_from([*tools, "nope", "BASH", ""]), args), check)


def _escaping_paths(fp: FuzzPlane) -> st.SearchStrategy[str]:
    """Paths that all name something outside the workspace (or nothing at all)."""
    depth = len(fp.workspace.parts)
    target = st.sampled_from(["secret.txt", "sub", "sub/new.txt", "", "new.txt"])
    climbs = st.integers(min_value=1, max_value=depth + 3)
    relative = st.builds(lambda n, t: "../" * n + str(fp.outside)[1:] + "/" + t, climbs, target)
    middle = st.builds(lambda n, t: "src/" + "../" * (n + 1) + str(fp.outside)[1:] + "/" + t, climbs, target)
    absolute = st.builds(lambda t: f"{fp.outside}/{t}", target)
    dotted = st.builds(lambda t: f"{fp.workspace}/../../../../{str(fp.outside)[1:]}/{t}", target)
    broken = st.sampled_from(["\x00", "src/\x00app.py", "x" * 5000, "/" * 300, f"{fp.outside}\x00/secret.txt"])
    return st.one_of(relative, middle, absolute, dotted, broken)


@pytest.mark.parametrize("tool", sorted(PATH_ARGS))
async def test_path_traversal_is_refused_and_reveals_nothing(fplane: FuzzPlane, tool: str) -> None:
    field, base = PATH_ARGS[tool]

    async def check(path: str) -> None:
        before = await snapshot(fplane)
        outcome = await drive_tool_call(fplane, [tool_call(fplane.live, tool, json.dumps({**base, field: path}))])
        assert_clear(outcome)  # the secret never shows
        after = await snapshot(fplane)
        assert after.outside == before.outside
        assert after.workspace == before.workspace
        if tool in ("write", "edit") and "\x00" not in path:
            # Outside the workspace is external_directory, which the client rejected.
            assert outcome.terminal()[0].WhichOneof("event") == "error", outcome.events

    await run_given(_escaping_paths(fplane), check)


async def test_apply_patch_cannot_reach_outside(fplane: FuzzPlane) -> None:
    async def check(path: str) -> None:
        before = await snapshot(fplane)
        patch = f"*** Begin Patch\n*** Add File: {path}\n+pwned\n*** End Patch"
        call = tool_call(fplane.live, "apply_patch", json.dumps({"patchText": patch}))
        outcome = await drive_tool_call(fplane, [call])
        assert_clear(outcome)
        after = await snapshot(fplane)
        assert (after.outside, after.workspace) == (before.outside, before.workspace)

    await run_given(_escaping_paths(fplane), check)


@pytest.mark.parametrize("size_mb", [1, MESSAGE_CAP_MB - 1, MESSAGE_CAP_MB + 1])
async def test_huge_arguments_up_to_and_over_the_message_cap(fplane: FuzzPlane, size_mb: int) -> None:
    before = await snapshot(fplane)
    blob = "x" * (size_mb * 1024 * 1024)
    args = json.dumps({"command": "echo " + blob, "description": "Big"})
    outcome = await drive_tool_call(fplane, [tool_call(fplane.live, "bash", args)])
    assert_clear(outcome)
    if size_mb >= MESSAGE_CAP_MB:
        assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (
            "Received message larger than max (" in outcome.details
        ), outcome.details
    else:
        assert outcome.code == grpc.StatusCode.OK
        # Too long for one exec (E2BIG) or run and truncated: either way an answer, not a crash.
        assert len(outcome.terminal()) == 1
    after = await snapshot(fplane)
    assert (after.sessions, after.workspace, after.outside) == (before.sessions, before.workspace, before.outside)


async def test_odd_unicode_and_nul_in_a_written_file_round_trip_or_fail_cleanly(fplane: FuzzPlane) -> None:
    async def check(content: str) -> None:
        name = "fuzz-" + os.urandom(4).hex() + ".txt"
        wrote = await drive_tool_call(
            fplane, [tool_call(fplane.live, "write", json.dumps({"filePath": name, "content": content}))]
        )
        assert_clear(wrote)
        path = fplane.workspace / name
        try:
            if wrote.terminal()[0].WhichOneof("event") == "result":
                assert path.read_bytes() == content.encode("utf-8", "surrogatepass")
        finally:
            path.unlink(missing_ok=True)

    odd = st.sampled_from(["\u202e\u0627", "\U0001f600", "a\x00b", "\ufeff", "\r\n", "\u0301" * 9])
    await run_given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300) | odd, check)
