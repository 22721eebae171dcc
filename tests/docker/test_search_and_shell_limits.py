"""Built-in search and shell tools at their limits through the real gRPC API against a real sandbox (glob,
grep and list footers and ignore lists, bash's workdir, timeouts and truncation, validation and `invalid`),
each compared byte for byte with the reference."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from controlplane.client import PermissionRequest, ToolOutcome
from controlplane.v1 import tool_pb2
from tests.docker.tool_limits import (
    FILES,
    GREP_HINT,
    TASK_HINT,
    WS,
    asks,
    call,
    file_output,
    sh,
    truncated_head,
)
from tests.planes import Plane, workspace_session
from tests.unit.zod.oracle import load_golden

pytestmark = pytest.mark.docker


session_id = workspace_session(FILES)


# -- glob -------------------------------------------------------------------------------------------


async def test_glob_limit_footer(docker_plane: Plane, session_id: str) -> None:
    await sh(docker_plane, session_id,
             f"mkdir -p {WS}/g105 && cd {WS}/g105 && for i in $(seq 1 105); do : > f$i.txt; done")
    out = await call(docker_plane, session_id, "glob", {"pattern": "*.txt", "path": f"{WS}/g105"})
    paths, footer = out.output.split("\n\n")
    assert footer == (
        "(Results are truncated: showing first 100 results. Consider using a more specific path or pattern.)"
    )
    names = paths.split("\n")
    assert len(set(names)) == 100
    assert all(re.fullmatch(rf"{WS}/g105/f\d+\.txt", name) for name in names)
    assert out.metadata == {"count": 100, "truncated": True}


async def test_glob_orders_newest_first(docker_plane: Plane, session_id: str) -> None:
    await sh(docker_plane, session_id, f"mkdir -p {WS}/gm && cd {WS}/gm && touch -d 2021-01-01 b.md && "
             "touch -d 2023-01-01 a.md && touch -d 2022-01-01 c.md")
    out = await call(docker_plane, session_id, "glob", {"pattern": "*.md", "path": f"{WS}/gm"})
    assert out.output == f"{WS}/gm/a.md\n{WS}/gm/c.md\n{WS}/gm/b.md"
    assert out.result is not None
    assert out.result.title == "workspace/gm"


async def test_list_limit(docker_plane: Plane, session_id: str) -> None:
    await sh(docker_plane, session_id, f"mkdir -p {WS}/l105 && cd {WS}/l105 && for i in $(seq 1 105); do : > f$i; done")
    out = await call(docker_plane, session_id, "list", {"path": f"{WS}/l105"})
    assert out.metadata == {"count": 100, "truncated": True}
    lines = out.output.split("\n")
    assert lines[0] == f"{WS}/l105/"
    assert lines[1:-1] == sorted(lines[1:-1])
    assert all(re.fullmatch(r"  f\d+", line) for line in lines[1:-1])
    assert lines[-1] == ""
    assert len(lines) == 102


# -- grep -------------------------------------------------------------------------------------------


async def test_grep_include(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "grep", {"pattern": "needle", "path": f"{WS}/gi", "include": "*.py"})
    assert out.output == f"Found 1 matches\n{WS}/gi/a.py:\n  Line 1: needle"
    assert out.metadata == {"matches": 1, "truncated": False}


async def test_grep_limit_footer(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "grep", {"pattern": "^hit$", "path": f"{WS}/gh"})
    body = "\n".join(f"  Line {i}: hit" for i in range(1, 101))
    assert out.output == (
        f"Found 105 matches (showing first 100)\n{WS}/gh/h.txt:\n{body}\n\n"
        "(Results truncated: showing 100 of 105 matches (5 hidden). Consider using a more specific path or pattern.)"
    )
    assert out.metadata == {"matches": 105, "truncated": True}
    assert out.result is not None
    assert out.result.title == "^hit$"


async def test_grep_cuts_long_lines(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "grep", {"pattern": "needle", "path": f"{WS}/gl"})
    assert out.output == f"Found 1 matches\n{WS}/gl/long.txt:\n  Line 1: needle{'c' * 1994}..."


async def test_grep_searches_hidden_and_git_dirs(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "grep", {"pattern": "hiddenneedle", "path": f"{WS}/gg"})
    assert out.metadata["matches"] == 2
    blocks = sorted(out.output.split("\n", 1)[1].split("\n\n"))
    assert out.output.startswith("Found 2 matches\n")
    assert blocks == [
        f"{WS}/gg/.git/config:\n  Line 1: [core] hiddenneedle", f"{WS}/gg/.hid/x.txt:\n  Line 1: hiddenneedle",
    ]


async def test_grep_empty_pattern_and_inaccessible_paths(docker_plane: Plane, session_id: str) -> None:
    empty = await call(docker_plane, session_id, "grep", {"pattern": "", "path": WS})
    assert empty.error == "pattern is required"
    await sh(docker_plane, session_id, f"mkdir -p {WS}/gx/locked && echo zebra > {WS}/gx/open.txt && "
             f"echo zebra > {WS}/gx/locked/in.txt && chmod 000 {WS}/gx/locked")
    out = await call(docker_plane, session_id, "grep", {"pattern": "zebra", "path": f"{WS}/gx"})
    await sh(docker_plane, session_id, f"chmod 755 {WS}/gx/locked")
    assert out.output == (
        f"Found 1 matches\n{WS}/gx/open.txt:\n  Line 1: zebra\n\n(Some paths were inaccessible and skipped)"
    )


# -- list -------------------------------------------------------------------------------------------


async def test_list_tree_skips_ignored(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/lst"
    out = await call(docker_plane, session_id, "list", {"path": path})
    assert out.output == (
        f"{path}/\n  keep/\n    skip.log\n  sub/\n    deeper/\n      c.txt\n    b.txt\n  a.txt\n  zz.txt\n"
    )
    assert out.metadata == {"count": 5, "truncated": False}
    fewer = await call(docker_plane, session_id, "list", {"path": path, "ignore": ["*.log", "sub/deeper/"]})
    assert fewer.output == f"{path}/\n  sub/\n    b.txt\n  a.txt\n  zz.txt\n"


# -- bash -------------------------------------------------------------------------------------------


async def bash(plane: Plane, session: str, command: str, *, agent: str = "",
               on_permission: Any = None, **extra: Any) -> ToolOutcome:
    kw: dict[str, Any] = {"agent": agent}
    if on_permission is not None:
        kw["on_permission"] = on_permission
    return await call(plane, session, "bash", {"command": command, "description": "Run it", **extra}, **kw)


async def test_bash_workdir_and_outputs(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "pwd", workdir=f"{WS}/gi")
    assert out.output == f"{WS}/gi\n"
    merged = await bash(docker_plane, session_id, "echo a; echo b >&2; echo c")
    assert merged.output == "a\nb\nc\n"
    quiet = await bash(docker_plane, session_id, "true")
    assert quiet.output == ""
    assert quiet.metadata == {"output": "", "exit": 0, "description": "Run it", "truncated": False}


async def test_bash_workdir_outside_asks(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "pwd", workdir="/tmp")
    assert asks(out) == [("external_directory", ["/tmp/*"], ["/tmp/*"])]
    assert out.output == "/tmp\n"


async def test_bash_timeout_keeps_partial_output(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "echo partial; sleep 5", timeout=300)
    assert out.output == (
        "partial\n\n\n<bash_metadata>\nbash tool terminated command after exceeding timeout 300 ms\n</bash_metadata>"
    )
    assert out.metadata["exit"] is None


async def test_bash_negative_timeout(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "echo x", timeout=-5)
    assert out.error == "Invalid timeout value: -5. Timeout must be a positive number."


async def test_bash_external_directory_ask(docker_plane: Plane, session_id: str) -> None:
    async def reject(request: PermissionRequest) -> tuple[int, str]:
        return tool_pb2.PermissionReply.REJECT, ""

    out = await bash(docker_plane, session_id, "cat /etc/hostname", on_permission=reject)
    assert out.error == "The user rejected permission to use this specific tool call."
    assert asks(out) == [("external_directory", ["/etc/*"], ["/etc/*"])]
    ok = await bash(docker_plane, session_id, "cat /etc/hostname")
    assert asks(ok) == [("external_directory", ["/etc/*"], ["/etc/*"])]
    assert ok.output.endswith("\n")
    assert ok.metadata["exit"] == 0


async def test_bash_metadata_output_is_capped(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "head -c 30010 /dev/zero | tr '\\0' a")
    assert out.output == "a" * 30010
    assert out.metadata["output"] == "a" * 30000 + "\n\n..."
    live = [json.loads(e.metadata.metadata_json) for e in out.events if e.WhichOneof("event") == "metadata"]
    assert live[0] == {"output": "", "description": "Run it"}
    assert live[-1] == {"output": "a" * 30000 + "\n\n...", "description": "Run it"}
    assert all(len(m["output"]) <= 30005 for m in live)


async def test_bash_truncated_by_bytes(docker_plane: Plane, session_id: str) -> None:
    # 1500 lines of 100 bytes: 506 lines (51105 bytes) fit in 51200; 151500 - 51105 bytes are removed.
    out = await bash(docker_plane, session_id, "for i in $(seq 1 1500); do printf '%0100d\\n' $i; done")
    path = out.metadata["outputPath"]
    preview = "\n".join(f"{i:0100d}" for i in range(1, 507))
    assert out.output == truncated_head(preview, 100395, "bytes", path, TASK_HINT)
    assert out.metadata["truncated"] is True


async def test_bash_single_huge_line_has_empty_preview(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "head -c 61440 /dev/zero | tr '\\0' a")
    assert out.output == truncated_head("", 61440, "bytes", out.metadata["outputPath"], TASK_HINT)


async def test_trailing_newline_counts_as_a_line(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "seq 1 2000")
    head = "\n".join(str(i) for i in range(1, 2001))
    assert out.output == truncated_head(head, 1, "lines", out.metadata["outputPath"], TASK_HINT)


async def test_truncation_hint_for_agent_without_task(docker_plane: Plane, session_id: str) -> None:
    out = await bash(docker_plane, session_id, "seq 1 3000", agent="explore")
    head = "\n".join(str(i) for i in range(1, 2001))
    assert out.output == truncated_head(head, 1001, "lines", out.metadata["outputPath"], GREP_HINT)


# -- validation and invalid -------------------------------------------------------------------------

TOOLS = {"read", "write", "edit", "multiedit", "bash", "glob", "grep", "list", "apply_patch"}
ZOD_CASES = [case for case in load_golden()["cases"] if "error" in case and case["tool"] in TOOLS]


@pytest.mark.parametrize("case", ZOD_CASES, ids=[f"{c['tool']}-{i}" for i, c in enumerate(ZOD_CASES)])
async def test_validation_message_is_zods(docker_plane: Plane, session_id: str, case: dict[str, Any]) -> None:
    out = await call(docker_plane, session_id, case["tool"], case["args"])
    assert out.error == (
        f"The {case['tool']} tool was called with invalid arguments: {case['error']}.\n"
        "Please rewrite the input so it satisfies the expected schema."
    )


async def test_tool_name_in_other_case_is_repaired(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "Read", {"filePath": f"{WS}/cr.txt"})
    assert out.output == file_output(f"{WS}/cr.txt", "1: a\n2: b\n3: c\n\n(End of file - total 3 lines)")


async def test_invalid_tool_output(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "invalid", {"tool": "x", "error": "bad things"})
    assert out.output == "The arguments provided to the tool are invalid: bad things"
    assert out.result is not None
    assert out.result.title == "Invalid Tool"
