"""Built-in file tools at their limits and failures through the real gRPC API against a real sandbox (read's
caps, footers and attachments, edit's replacers and refusals, write, apply_patch's failures), each compared
byte for byte with the reference."""

from __future__ import annotations

import base64
import re
import time
from typing import Any

import pytest

from controlplane.client import PermissionRequest, ToolOutcome
from controlplane.v1 import tool_pb2
from tests.docker.tool_limits import (
    CAPPED,
    FILES,
    PNG,
    WS,
    asks,
    call,
    file_output,
    sh,
)
from tests.planes import Plane, workspace_session
from tests.tool_uids import tool_uid

pytestmark = pytest.mark.docker


session_id = workspace_session(FILES)


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
    uid = tool_uid(docker_plane.instance, (await docker_plane.client.get_session(session_id)).sandbox_id)
    assert await sh(docker_plane, session_id, f"stat -c '%a %u' {path}; cat {path}") == f"644 {uid}\nhello\n".encode()


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
