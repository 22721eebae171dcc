"""More built-in tool cases through the real gRPC API against a real sandbox: limits, footers, replacers,
patch failures, ignore lists and truncation, each compared byte for byte with the reference."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controlplane.client import PermissionRequest, ToolOutcome
from controlplane.v1 import tool_pb2
from tests.archives import tar_of
from tests.planes import Plane
from tests.unit.zod.oracle import load_golden

pytestmark = pytest.mark.docker

WS = "/workspace"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
BIG_LINE = "b" * 2500
CAPPED = [f"{i:04d}" + "x" * 95 for i in range(1, 1001)]  # 99 characters a line
FILES: dict[str, str | bytes] = {
    "long.txt": "a" * 2500 + "\nshort\n",
    "capped.txt": "".join(line + "\n" for line in CAPPED),
    "empty.txt": "",
    "cr.txt": "a\rb\nc\n",
    "entries/e1.txt": "1", "entries/e2.txt": "2", "entries/e3.txt": "3", "entries/e4.txt": "4",
    "entries/e5/x.txt": "5",
    "schema.fbs": "table T {}\n",
    "icon.svg": "<svg/>\n",
    "pic.png": PNG,
    "empty.dat": "",
    "sub/AGENTS.md": "Be careful here.\n",
    "sub/code.txt": "x = 1\n",
    "e/trimmed.py": "def f():\n    x = 1\n    y = 2\n",
    "e/anchor.txt": "start\n  alpha = 1\n  beta = 2\nend\n",
    "e/unrelated.txt": "start\n  one\n  two\nend\n",
    "e/spaces.txt": "x  =   compute(a,  b)\nkeep\n",
    "e/inline.txt": "    result  =  value + 1  # note\n",
    "e/escape.txt": "msg = 'a\tb'\n",
    "e/boundary.txt": "x = f(1,\n      2) + g\n",
    "e/context.txt": "begin\n\n\n\nfoo\nxyz\nend\n",
    "e/many.txt": "a b a b a\n",
    "e/stale.txt": "old\n",
    "p/ctx.py": "def g():\n    return 1\n\ndef f():\n    return 1\n",
    "p/mv/src.txt": "one\ntwo\n",
    "p/keep.txt": "keep\n",
    "gi/a.py": "needle\n", "gi/b.txt": "needle\n",
    "gh/h.txt": "hit\n" * 105,
    "gl/long.txt": "needle" + "c" * 2500 + "\n",
    "gg/.git/config": "[core] hiddenneedle\n", "gg/.hid/x.txt": "hiddenneedle\n",
    "lst/a.txt": "", "lst/zz.txt": "", "lst/sub/b.txt": "", "lst/sub/deeper/c.txt": "", "lst/keep/skip.log": "",
    "lst/node_modules/m.js": "", "lst/build/out.o": "", "lst/.coverage": "", "lst/__pycache__/c.pyc": "",
    "w/over.txt": "before\n",
    "p/obsolete.txt": "obsolete\n",
    **{f"coll/{name}": "" for name in ["Zed", "éclair", "B.txt", "Apple2", "apple", "a.txt", "9.txt", "10.txt",
                                        ".hidden", "_under"]},
}


@pytest.fixture(scope="module")
async def session_id(docker_plane: Plane) -> AsyncIterator[str]:
    session = await docker_plane.client.create_session(workspace_archive=tar_of(FILES))
    yield session.id
    await docker_plane.client.delete_session(session.id)


async def call(plane: Plane, session: str, tool: str, args: dict[str, Any] | str, **kw: Any) -> ToolOutcome:
    return await plane.client.execute_tool(session, tool, args, **kw)


async def sh(plane: Plane, session: str, script: str) -> bytes:
    done = await plane.client.run(session, ["sh", "-c", script])
    assert done.exit_code == 0, done.stderr
    return done.stdout


def asks(outcome: ToolOutcome) -> list[tuple[str, list[str], list[str]]]:
    return [(r.permission, list(r.patterns), list(r.always)) for r in outcome.permission_requests]


def file_output(path: str, body: str) -> str:
    return f"<path>{path}</path>\n<type>file</type>\n<content>{body}\n</content>"


TASK_HINT = ("Use the Task tool to have explore agent process this file with Grep and Read (with offset/limit). "
             "Do NOT read the full file yourself - delegate to save context.")
GREP_HINT = "Use Grep to search the full content or Read with offset/limit to view specific sections."


def truncated_head(preview: str, removed: int, unit: str, path: str, hint: str) -> str:
    return (f"{preview}\n\n...{removed} {unit} truncated...\n\nThe tool call succeeded but the output was truncated. "
            f"Full output saved to: {path}\n{hint}")


# -- read -------------------------------------------------------------------------------------------


async def test_read_cuts_long_lines(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/long.txt"})
    line = "a" * 2000 + "... (line truncated to 2000 chars)"
    assert out.output == file_output(f"{WS}/long.txt", f"1: {line}\n2: short\n\n(End of file - total 2 lines)")
    assert out.metadata["preview"] == line + "\nshort"


async def test_read_byte_cap_footer(docker_plane: Plane, session_id: str) -> None:
    # 99-byte lines plus joining newlines: 512 lines are 51199 bytes, a 513th would pass 51200.
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/capped.txt"})
    body = "\n".join(f"{i}: {CAPPED[i - 1]}" for i in range(1, 513))
    assert out.output == file_output(
        f"{WS}/capped.txt", body + "\n\n(Output capped at 50 KB. Showing lines 1-512. Use offset=513 to continue.)"
    )
    assert out.metadata["truncated"] is True
    later = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/capped.txt", "offset": 990, "limit": 5})
    body = "\n".join(f"{i}: {CAPPED[i - 1]}" for i in range(990, 995))
    assert later.output == file_output(
        f"{WS}/capped.txt", body + "\n\n(Showing lines 990-994 of 1000. Use offset=995 to continue.)"
    )


async def test_read_empty_file(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/empty.txt"})
    assert out.output == (
        f"<path>{WS}/empty.txt</path>\n<type>file</type>\n<content>\n\n(End of file - total 0 lines)\n</content>"
    )
    assert out.metadata == {"preview": "", "truncated": False, "loaded": []}


async def test_read_lone_cr_ends_a_line(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/cr.txt"})
    assert out.output == file_output(f"{WS}/cr.txt", "1: a\n2: b\n3: c\n\n(End of file - total 3 lines)")


async def test_read_directory_paging(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/entries"
    first = await call(docker_plane, session_id, "read", {"filePath": path, "limit": 2})
    assert first.output == (
        f"<path>{path}</path>\n<type>directory</type>\n<entries>\ne1.txt\ne2.txt\n\n"
        "(Showing 2 of 5 entries. Use 'offset' parameter to read beyond entry 3)\n</entries>"
    )
    assert first.metadata == {"preview": "e1.txt\ne2.txt", "truncated": True, "loaded": []}
    rest = await call(docker_plane, session_id, "read", {"filePath": path, "offset": 4, "limit": 5})
    assert rest.output == (
        f"<path>{path}</path>\n<type>directory</type>\n<entries>\ne4.txt\ne5/\n\n(5 entries)\n</entries>"
    )


async def test_read_directory_uses_locale_collation(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/coll"})
    entries = "_under\n.hidden\n10.txt\n9.txt\na.txt\napple\nApple2\nB.txt\néclair\nZed"
    assert out.output == (
        f"<path>{WS}/coll</path>\n<type>directory</type>\n<entries>\n{entries}\n\n(10 entries)\n</entries>"
    )


async def test_read_offset_below_one(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/cr.txt", "offset": 0})
    assert out.error == "offset must be greater than or equal to 1"


async def test_read_coerces_string_offset(docker_plane: Plane, session_id: str) -> None:
    # Platform decision: arguments reach the tool as zod parsed them, so "2" is the number 2 (upstream: "02: ").
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/cr.txt", "offset": "2", "limit": "1"})
    assert out.output == file_output(f"{WS}/cr.txt", "2: b\n\n(Showing lines 2-2 of 3. Use offset=3 to continue.)")


@pytest.mark.parametrize(("name", "text"), [("schema.fbs", "table T {}"), ("icon.svg", "<svg/>")])
async def test_read_fbs_and_svg_as_text(docker_plane: Plane, session_id: str, name: str, text: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/{name}"})
    assert out.output == file_output(f"{WS}/{name}", f"1: {text}\n\n(End of file - total 1 lines)")
    assert out.result is not None
    assert list(out.result.attachments) == []


async def test_read_png_is_an_attachment(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/pic.png"})
    assert out.output == "Image read successfully"
    assert out.result is not None
    assert out.result.title == "workspace/pic.png"
    assert out.metadata["truncated"] is False
    [attachment] = out.result.attachments
    assert (attachment.type, attachment.mime) == ("file", "image/png")
    assert attachment.url == "data:image/png;base64," + base64.b64encode(PNG).decode()


async def test_read_empty_dat_is_binary(docker_plane: Plane, session_id: str) -> None:
    out = await call(docker_plane, session_id, "read", {"filePath": f"{WS}/empty.dat"})
    assert out.error == f"Cannot read binary file: {WS}/empty.dat"


async def test_read_injects_agents_md_once_per_session(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/sub/code.txt"
    first = await call(docker_plane, session_id, "read", {"filePath": path})
    assert first.output == file_output(path, "1: x = 1\n\n(End of file - total 1 lines)") + (
        f"\n\n<system-reminder>\nInstructions from: {WS}/sub/AGENTS.md\nBe careful here.\n\n</system-reminder>"
    )
    assert first.metadata["loaded"] == [f"{WS}/sub/AGENTS.md"]
    second = await call(docker_plane, session_id, "read", {"filePath": path})
    assert second.output == file_output(path, "1: x = 1\n\n(End of file - total 1 lines)")
    assert second.metadata["loaded"] == []


async def test_read_outside_asks_external_directory(docker_plane: Plane, session_id: str) -> None:
    seen: list[PermissionRequest] = []

    async def reject(request: PermissionRequest) -> tuple[int, str]:
        seen.append(request)
        return tool_pb2.PermissionReply.REJECT, ""

    out = await call(docker_plane, session_id, "read", {"filePath": "/etc/hostname"}, on_permission=reject)
    assert out.error == "The user rejected permission to use this specific tool call."
    assert [(r.permission, list(r.patterns), list(r.always)) for r in seen] == [
        ("external_directory", ["/etc/*"], ["/etc/*"])
    ]
    ok = await call(docker_plane, session_id, "read", {"filePath": "/etc/hostname"})
    assert asks(ok) == [("external_directory", ["/etc/*"], ["/etc/*"])]
    assert ok.output.startswith("<path>/etc/hostname</path>\n<type>file</type>\n<content>1: ")
    assert ok.result is not None
    assert ok.result.title == "etc/hostname"
    # Both asks come before the existence check.
    gone = await call(docker_plane, session_id, "read", {"filePath": "/etc/no-such-file"})
    assert asks(gone) == [("external_directory", ["/etc/*"], ["/etc/*"])]
    assert gone.error == "File not found: /etc/no-such-file"


# -- edit -------------------------------------------------------------------------------------------


async def edit(plane: Plane, session: str, name: str, old: str, new: str, **extra: Any) -> ToolOutcome:
    path = f"{WS}/{name}"
    await call(plane, session, "read", {"filePath": path})
    return await call(plane, session, "edit", {"filePath": path, "oldString": old, "newString": new, **extra})


async def cat(plane: Plane, session: str, name: str) -> bytes:
    return await sh(plane, session, f"cat {WS}/{name}")


EDITS = [
    # LineTrimmed: the lines match once trimmed; the original span (indentation included) is replaced.
    ("e/trimmed.py", "x = 1\ny = 2", "    z = 3", b"def f():\n    z = 3\n"),
    # BlockAnchor: same anchors, middle lines similar enough (not equal, so LineTrimmed fails).
    ("e/anchor.txt", "start\n  alpha = 10\n  beta = 2\nend", "START", b"START\n"),
    # WhitespaceNormalized, a whole line and part of a line.
    ("e/spaces.txt", "x = compute(a, b)", "y = 1", b"y = 1\nkeep\n"),
    ("e/inline.txt", "result = value + 1", "z", b"    z  # note\n"),
    # EscapeNormalized: the model wrote a literal backslash-t where the file has a tab.
    ("e/escape.txt", "msg = 'a\\tb'", "msg = 'c'", b"msg = 'c'\n"),
    # TrimmedBoundary: the trimmed find sits mid-line on two lines.
    ("e/boundary.txt", "  f(1,\n      2)  ", "h()", b"x = h() + g\n"),
    # ContextAware: half the non-empty middle lines match; BlockAnchor's similarity is (1 + 0) / 5 < 0.3.
    ("e/context.txt", "begin\n\n\n\nfoo\nabc\nend", "DONE", b"DONE\n"),
]


@pytest.mark.parametrize(("name", "old", "new", "after"), EDITS)
async def test_edit_replacers(docker_plane: Plane, session_id: str, name: str, old: str, new: str,
                              after: bytes) -> None:
    out = await edit(docker_plane, session_id, name, old, new)
    assert out.output == "Edit applied successfully."
    assert await cat(docker_plane, session_id, name) == after


async def test_edit_block_anchor_needs_similar_middle_lines(docker_plane: Plane, session_id: str) -> None:
    # Platform decision: a lone candidate with unrelated middle lines is not replaced (upstream issue #24959).
    out = await edit(docker_plane, session_id, "e/unrelated.txt", "start\n  completely\n  different\nend", "X")
    assert out.error == (
        "Could not find oldString in the file. It must match exactly, including whitespace, indentation, "
        "and line endings."
    )
    assert await cat(docker_plane, session_id, "e/unrelated.txt") == b"start\n  one\n  two\nend\n"


async def test_edit_multiple_matches_and_replace_all(docker_plane: Plane, session_id: str) -> None:
    many = await edit(docker_plane, session_id, "e/many.txt", "a", "c")
    assert many.error == (
        "Found multiple matches for oldString. Provide more surrounding context to make the match unique."
    )
    out = await edit(docker_plane, session_id, "e/many.txt", "a", "c", replaceAll=True)
    assert out.output == "Edit applied successfully."
    assert await cat(docker_plane, session_id, "e/many.txt") == b"c b c b c\n"
    assert out.metadata["filediff"]["additions"] == 1
    assert out.metadata["filediff"]["deletions"] == 1


async def test_edit_refusals(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/e"
    both_empty = await call(docker_plane, session_id, "edit", {"filePath": path, "oldString": "", "newString": ""})
    assert both_empty.error == "No changes to apply: oldString and newString are identical."
    directory = await call(docker_plane, session_id, "edit", {"filePath": path, "oldString": "a", "newString": "b"})
    assert directory.error == f"Path is a directory, not a file: {WS}/e"


async def test_edit_empty_old_string_creates_a_file(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/e/new/dir/created.txt"
    out = await call(docker_plane, session_id, "edit", {"filePath": path, "oldString": "", "newString": "fresh\n"})
    assert out.output == "Edit applied successfully."
    assert out.result is not None
    assert out.result.title == "workspace/e/new/dir/created.txt"
    assert out.metadata["filediff"] == {"file": path, "before": "", "after": "fresh\n", "additions": 1, "deletions": 0}
    assert await cat(docker_plane, session_id, "e/new/dir/created.txt") == b"fresh\n"


async def test_edit_refuses_a_file_modified_since_read(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/e/stale.txt"
    await call(docker_plane, session_id, "read", {"filePath": path})
    future = int(time.time()) + 3600
    await sh(docker_plane, session_id, f"touch -d @{future} {path}")
    out = await call(docker_plane, session_id, "edit", {"filePath": path, "oldString": "old", "newString": "new"})
    assert out.error is not None
    modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(future))
    prefix = f"File {path} has been modified since it was last read.\nLast modification: {modified}\nLast read: "
    assert out.error.startswith(prefix)
    rest = out.error[len(prefix):]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\n\nPlease read the file again before modifying it\.",
                        rest), rest
    assert await cat(docker_plane, session_id, "e/stale.txt") == b"old\n"


# -- write ------------------------------------------------------------------------------------------


async def test_write_new_file_in_new_directories(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/w/deep/er/new.txt"
    out = await call(docker_plane, session_id, "write", {"filePath": path, "content": "hello\n"})
    assert out.output == "Wrote file successfully."
    assert out.result is not None
    assert out.result.title == "workspace/w/deep/er/new.txt"
    assert out.metadata == {"diagnostics": {}, "filepath": path, "exists": False, "truncated": False}
    assert await sh(docker_plane, session_id, f"stat -c '%a %u' {path}; cat {path}") == b"644 1000\nhello\n"


async def test_write_overwrites_after_read(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/w/over.txt"
    await call(docker_plane, session_id, "read", {"filePath": path})
    out = await call(docker_plane, session_id, "write", {"filePath": path, "content": "after\n"})
    assert out.output == "Wrote file successfully."
    assert out.metadata["exists"] is True
    assert await cat(docker_plane, session_id, "w/over.txt") == b"after\n"


# -- apply_patch ------------------------------------------------------------------------------------


async def patch(plane: Plane, session: str, body: str) -> ToolOutcome:
    return await call(plane, session, "apply_patch", {"patchText": f"*** Begin Patch\n{body}\n*** End Patch"})


async def test_apply_patch_move(docker_plane: Plane, session_id: str) -> None:
    out = await patch(docker_plane, session_id,
                      "*** Update File: p/mv/src.txt\n*** Move to: p/mv2/dst.txt\n@@\n one\n-two\n+TWO")
    assert out.output == "Success. Updated the following files:\nM workspace/p/mv2/dst.txt"
    [entry] = out.metadata["files"]
    assert (entry["type"], entry["filePath"], entry["movePath"], entry["relativePath"]) == (
        "move", f"{WS}/p/mv/src.txt", f"{WS}/p/mv2/dst.txt", "workspace/p/mv2/dst.txt"
    )
    listing = await sh(docker_plane, session_id, f"cat {WS}/p/mv2/dst.txt; ls -A {WS}/p/mv; echo end")
    assert listing == b"one\nTWO\nend\n"  # the emptied source directory stays


async def test_apply_patch_context_and_verification_failures(docker_plane: Plane, session_id: str) -> None:
    path = f"{WS}/p/ctx.py"
    missing = await patch(docker_plane, session_id, "*** Update File: p/ctx.py\n@@ def nope():\n-    return 1\n+    x")
    assert missing.error == f"apply_patch verification failed: Error: Failed to find context 'def nope():' in {path}"
    lines = await patch(docker_plane, session_id, "*** Update File: p/ctx.py\n@@ def f():\n-    return 99\n+    x")
    assert lines.error == (
        f"apply_patch verification failed: Error: Failed to find expected lines in {path}:\n    return 99"
    )
    out = await patch(docker_plane, session_id, "*** Update File: p/ctx.py\n@@ def f():\n-    return 1\n+    return 2")
    assert out.output == "Success. Updated the following files:\nM workspace/p/ctx.py"
    assert await cat(docker_plane, session_id, "p/ctx.py") == b"def g():\n    return 1\n\ndef f():\n    return 2\n"


async def test_apply_patch_failure_leaves_every_file_untouched(docker_plane: Plane, session_id: str) -> None:
    out = await patch(docker_plane, session_id,
                      "*** Add File: p/added.txt\n+new\n*** Update File: p/keep.txt\n@@\n-absent\n+x")
    assert out.error == (
        f"apply_patch verification failed: Error: Failed to find expected lines in {WS}/p/keep.txt:\nabsent"
    )
    state = await sh(docker_plane, session_id, f"cat {WS}/p/keep.txt; test -e {WS}/p/added.txt || echo none")
    assert state == b"keep\nnone\n"


async def test_apply_patch_small_errors_and_delete_count(docker_plane: Plane, session_id: str) -> None:
    empty = await call(docker_plane, session_id, "apply_patch", {"patchText": ""})
    assert empty.error == "patchText is required"
    missing = await patch(docker_plane, session_id, "*** Update File: p/none.txt\n@@\n-a\n+b")
    assert missing.error == f"apply_patch verification failed: Failed to read file to update: {WS}/p/none.txt"
    out = await patch(docker_plane, session_id, "*** Delete File: p/obsolete.txt")
    assert out.output == "Success. Updated the following files:\nD workspace/p/obsolete.txt"
    [entry] = out.metadata["files"]
    assert (entry["type"], entry["additions"], entry["deletions"]) == ("delete", 0, 2)


async def test_apply_patch_heredoc_and_no_hunks(docker_plane: Plane, session_id: str) -> None:
    text = "cat <<'EOF'\n*** Begin Patch\n*** Add File: p/heredoc.txt\n+hi\n*** End Patch\nEOF"
    out = await call(docker_plane, session_id, "apply_patch", {"patchText": text})
    assert out.output == "Success. Updated the following files:\nA workspace/p/heredoc.txt"
    assert await cat(docker_plane, session_id, "p/heredoc.txt") == b"hi\n"
    none = await patch(docker_plane, session_id, "*** Bogus header")
    assert none.error == "apply_patch verification failed: no hunks found"


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
