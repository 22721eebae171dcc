"""edit, write and multiedit through `run`, plus the jsdiff-compatible diffs they report."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.tools import edit, multiedit, write
from sandbox_agent.tools.base import ToolContext, ToolError
from sandbox_agent.tools.diffs import count_changes, trim_diff, unified_diff

from .conftest import Asked, Recorder

MakeCtx = Callable[..., ToolContext]
NOT_FOUND = ("Could not find oldString in the file. It must match exactly, including whitespace, indentation, "
             "and line endings.")
MULTIPLE = "Found multiple matches for oldString. Provide more surrounding context to make the match unique."
HEAD = "Index: {p}\n===================================================================\n--- {p}\n+++ {p}\n"
READ_AT = 1773655200.0  # 2026-03-16T10:00:00.000Z


def read(ctx: ToolContext, path: Path) -> None:
    """What the read tool records."""
    ctx.file_times.read(str(path), time.time())


async def run_error(tool: Any, args: dict[str, Any], ctx: ToolContext) -> str:
    with pytest.raises(ToolError) as err:
        await tool.run(args, ctx)
    return str(err.value)


# --- diffs (expected texts produced by jsdiff 8 createTwoFilesPatch/diffLines + upstream's trimDiff) ---

def test_diff_trims_common_indentation() -> None:
    before = "    if (a) {\n        b()\n    }\n"
    after = "    if (a) {\n        c()\n    }\n"
    assert unified_diff("/p/f.txt", before, after) == HEAD.format(p="/p/f.txt") + (
        "@@ -1,3 +1,3 @@\n if (a) {\n-    b()\n+    c()\n }\n")
    assert count_changes(before, after) == (1, 1)


def test_diff_no_newline_markers() -> None:
    assert unified_diff("/p/f.txt", "a\nb", "a\nb\nc") == HEAD.format(p="/p/f.txt") + (
        "@@ -1,2 +1,3 @@\n a\n-b\n\\ No newline at end of file\n+b\n+c\n\\ No newline at end of file\n")
    assert count_changes("a\nb", "a\nb\nc") == (2, 1)


def test_diff_separate_and_merged_hunks() -> None:
    before = "".join(f"line {i}\n" for i in range(1, 31))
    after = before.replace("line 3\n", "LINE 3\n").replace("line 25\n", "").replace("line 14\n", "line 14\nnew 14b\n")
    assert unified_diff("/p/f.txt", before, after) == HEAD.format(p="/p/f.txt") + (
        "@@ -1,7 +1,7 @@\n line 1\n line 2\n-line 3\n+LINE 3\n line 4\n line 5\n line 6\n line 7\n"
        "@@ -11,8 +11,9 @@\n line 11\n line 12\n line 13\n line 14\n+new 14b\n line 15\n line 16\n line 17\n line 18\n"
        "@@ -21,9 +22,8 @@\n line 21\n line 22\n line 23\n line 24\n-line 25\n line 26\n line 27\n line 28\n line 29\n")
    assert count_changes(before, after) == (2, 2)
    # Changes eight unchanged lines apart share one hunk.
    merged = unified_diff("f", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "a\nB\nc\nd\ne\nf\ng\nh\ni\nJ\n")
    assert merged == HEAD.format(p="f") + "@@ -1,10 +1,10 @@\n a\n-b\n+B\n c\n d\n e\n f\n g\n h\n i\n-j\n+J\n"


def test_diff_empty_sides() -> None:
    assert unified_diff("/p/f.txt", "", "x\ny\n") == HEAD.format(p="/p/f.txt") + "@@ -0,0 +1,2 @@\n+x\n+y\n"
    assert unified_diff("/p/f.txt", "x\n", "") == HEAD.format(p="/p/f.txt") + "@@ -1,1 +0,0 @@\n-x\n"
    assert unified_diff("/p/f.txt", "same\n", "same\n") == HEAD.format(p="/p/f.txt")
    assert count_changes("", "x\ny\n") == (2, 0)


def test_diff_follows_jsdiff_alignment_of_repeated_lines() -> None:
    # difflib alone pairs these differently; jsdiff's Myers puts the changes here.
    assert unified_diff("f", "b\n\n", "z\nb\nb\n\nq\n") == HEAD.format(p="f") + "@@ -1,2 +1,5 @@\n+z\n b\n+b\n \n+q\n"
    assert unified_diff("f", "}\n}\nx\n}\n", "}\nx\n}\n}\n") == HEAD.format(p="f") + (
        "@@ -1,4 +1,4 @@\n }\n-}\n x\n }\n+}\n")
    assert count_changes("b\n\n", "z\nb\nb\n\nq\n") == (3, 0)


def test_trim_diff_ignores_headers_and_blank_lines() -> None:
    text = "--- a\n+++ a\n@@ -1,2 +1,2 @@\n-    x\n+    y\n \n"
    assert trim_diff(text) == "--- a\n+++ a\n@@ -1,2 +1,2 @@\n-x\n+y\n \n"
    assert trim_diff("-x\n+  y\n") == "-x\n+  y\n"


# --- edit ---

async def test_edit_argument_errors(make_ctx: MakeCtx, recorder: Recorder) -> None:
    ctx = make_ctx()
    assert await run_error(edit, {"filePath": "", "oldString": "a", "newString": "b"}, ctx) == "filePath is required"
    identical = "No changes to apply: oldString and newString are identical."
    assert await run_error(edit, {"filePath": "x", "oldString": "", "newString": ""}, ctx) == identical
    assert await run_error(edit, {"filePath": "x", "oldString": "a", "newString": "a"}, ctx) == identical
    assert recorder.asks == []


async def test_edit_missing_file_and_directory(make_ctx: MakeCtx, project: Path) -> None:
    ctx = make_ctx()
    missing = project / "nope.txt"
    assert await run_error(edit, {"filePath": str(missing), "oldString": "a", "newString": "b"}, ctx) == (
        f"File {missing} not found")
    (project / "dir").mkdir()
    assert await run_error(edit, {"filePath": "dir", "oldString": "a", "newString": "b"}, ctx) == (
        f"Path is a directory, not a file: {project / 'dir'}")


async def test_edit_requires_a_read(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "a.txt"
    target.write_text("hello\n")
    message = await run_error(edit, {"filePath": str(target), "oldString": "hello", "newString": "bye"}, make_ctx())
    assert message == f"You must read file {target} before overwriting it. Use the Read tool first"
    assert target.read_text() == "hello\n"
    assert recorder.asks == []


async def test_edit_refuses_a_file_modified_since_read(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "a.txt"
    target.write_text("hello\n")
    ctx = make_ctx()
    ctx.file_times.read(str(target), READ_AT)
    os.utime(target, ns=(0, int(READ_AT * 1e9) + 60_500_000_000))
    message = await run_error(edit, {"filePath": str(target), "oldString": "hello", "newString": "bye"}, ctx)
    assert message == (f"File {target} has been modified since it was last read.\n"
                       "Last modification: 2026-03-16T10:01:00.500Z\nLast read: 2026-03-16T10:00:00.000Z\n\n"
                       "Please read the file again before modifying it.")


async def test_filetime_tolerance_is_50ms(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "a.txt"
    target.write_text("one two\n")
    ctx = make_ctx()
    ctx.file_times.read(str(target), READ_AT)
    os.utime(target, ns=(0, int(READ_AT * 1e9) + 50_000_000))
    await edit.run({"filePath": str(target), "oldString": "one", "newString": "1"}, ctx)
    ctx.file_times.read(str(target), READ_AT)
    os.utime(target, ns=(0, int(READ_AT * 1e9) + 51_000_000))
    message = await run_error(edit, {"filePath": str(target), "oldString": "two", "newString": "2"}, ctx)
    assert "Last modification: 2026-03-16T10:00:00.051Z\nLast read: 2026-03-16T10:00:00.000Z" in message


async def test_filetime_check_can_be_disabled(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "a.txt"
    target.write_text("hello\n")
    await edit.run({"filePath": str(target), "oldString": "hello", "newString": "bye"},
                   make_ctx(disable_filetime_check=True))
    assert target.read_text() == "bye\n"


async def test_read_then_edit_then_edit_again(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "a.txt"
    target.write_text("alpha\nbeta\n")
    ctx = make_ctx()
    read(ctx, target)
    await edit.run({"filePath": str(target), "oldString": "alpha", "newString": "ALPHA"}, ctx)
    # The edit counts as a read: a follow-up edit needs no new read.
    await edit.run({"filePath": str(target), "oldString": "beta", "newString": "BETA"}, ctx)
    assert target.read_text() == "ALPHA\nBETA\n"


async def test_edit_result_shape(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "src" / "a.py"
    target.parent.mkdir()
    before = "def f():\n    return 1\n"
    target.write_text(before)
    ctx = make_ctx(worktree=str(project))
    read(ctx, target)
    result = await edit.run({"filePath": "src/a.py", "oldString": "return 1", "newString": "return 2"}, ctx)
    after = "def f():\n    return 2\n"
    diff = HEAD.format(p=target) + "@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
    filediff = {"file": str(target), "before": before, "after": after, "additions": 1, "deletions": 1}
    assert result.title == "src/a.py"
    assert result.output == "Edit applied successfully."
    assert result.metadata == {"diagnostics": {}, "diff": diff, "filediff": filediff}
    assert recorder.asks == [Asked("edit", ["src/a.py"], ["*"], {"filepath": str(target), "diff": diff})]
    assert recorder.updates == [(None, {"diff": diff, "filediff": filediff, "diagnostics": {}})]
    assert target.read_text() == after


async def test_edit_title_relative_to_root_outside_git(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "a.txt"
    target.write_text("x\n")
    ctx = make_ctx()
    read(ctx, target)
    result = await edit.run({"filePath": str(target), "oldString": "x", "newString": "y"}, ctx)
    assert result.title == str(target).lstrip("/")


async def test_edit_match_errors_leave_file_alone(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "a.txt"
    target.write_text("foo\nfoo\n")
    ctx = make_ctx()
    read(ctx, target)
    assert await run_error(edit, {"filePath": str(target), "oldString": "foo", "newString": "b"}, ctx) == MULTIPLE
    assert await run_error(edit, {"filePath": str(target), "oldString": "zzz", "newString": "b"}, ctx) == NOT_FOUND
    assert target.read_text() == "foo\nfoo\n"
    assert recorder.asks == []
    await edit.run({"filePath": str(target), "oldString": "foo", "newString": "bar", "replaceAll": True}, ctx)
    assert target.read_text() == "bar\nbar\n"


async def test_edit_create_and_overwrite_with_empty_old_string(
        make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    ctx = make_ctx(worktree=str(project))
    created = project / "new" / "deep" / "file.txt"
    result = await edit.run({"filePath": str(created), "oldString": "", "newString": "a\nb\n"}, ctx)
    assert created.read_text() == "a\nb\n"
    assert result.metadata["filediff"] == {"file": str(created), "before": "", "after": "a\nb\n",
                                           "additions": 2, "deletions": 0}
    assert recorder.asks[0].patterns == ["new/deep/file.txt"]
    # An existing, never-read file is overwritten too, and its old content counts as empty.
    existing = project / "old.txt"
    existing.write_text("old\n")
    result = await edit.run({"filePath": str(existing), "oldString": "", "newString": "new\n"}, ctx)
    assert existing.read_text() == "new\n"
    assert result.metadata["diff"] == HEAD.format(p=existing) + "@@ -0,0 +1,1 @@\n+new\n"
    assert result.metadata["filediff"]["before"] == ""


async def test_edit_keeps_crlf(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "win.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    ctx = make_ctx()
    read(ctx, target)
    result = await edit.run({"filePath": str(target), "oldString": "one\ntwo", "newString": "uno\ndos"}, ctx)
    assert target.read_bytes() == b"uno\r\ndos\r\nthree\r\n"
    # The diff is over LF text; the counts and before/after are the raw content.
    assert result.metadata["diff"] == HEAD.format(p=target) + "@@ -1,3 +1,3 @@\n-one\n-two\n+uno\n+dos\n three\n"
    assert result.metadata["filediff"]["after"] == "uno\r\ndos\r\nthree\r\n"
    assert (result.metadata["filediff"]["additions"], result.metadata["filediff"]["deletions"]) == (2, 2)


async def test_edit_outside_project_asks_external_directory(
        make_ctx: MakeCtx, tmp_path: Path, recorder: Recorder) -> None:
    outside = tmp_path / "elsewhere" / "f.txt"
    outside.parent.mkdir()
    outside.write_text("x\n")
    ctx = make_ctx()
    read(ctx, outside)
    await edit.run({"filePath": str(outside), "oldString": "x", "newString": "y"}, ctx)
    glob = f"{outside.parent}/*"
    assert recorder.asks[0] == Asked("external_directory", [glob], [glob],
                                     {"filepath": str(outside), "parentDir": str(outside.parent)})
    assert recorder.asks[1].permission == "edit"
    recorder.deny.add("external_directory")
    message = await run_error(edit, {"filePath": str(outside), "oldString": "y", "newString": "z"}, ctx)
    assert message == "The user rejected permission to use this specific tool call."
    assert outside.read_text() == "y\n"


async def test_edit_denied_writes_nothing(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "a.txt"
    target.write_text("x\n")
    ctx = make_ctx()
    read(ctx, target)
    recorder.deny.add("edit")
    await run_error(edit, {"filePath": str(target), "oldString": "x", "newString": "y"}, ctx)
    assert target.read_text() == "x\n"
    assert recorder.updates == []


async def test_concurrent_edits_to_one_file_serialise(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "a.txt"
    target.write_text("".join(f"line {i}\n" for i in range(10)))
    ctx = make_ctx()
    read(ctx, target)
    active = 0
    overlaps: list[int] = []

    async def slow_ask(permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any],
                       checks: Sequence[str] = ()) -> None:
        nonlocal active
        active += 1
        overlaps.append(active)
        await asyncio.sleep(0.02)  # the other edits would read the old content here without the lock
        active -= 1

    ctx.ask = slow_ask
    await asyncio.gather(*(edit.run({"filePath": str(target), "oldString": f"line {i}\n", "newString": f"L{i}\n"}, ctx)
                           for i in range(5)))
    assert target.read_text() == "".join(f"L{i}\n" for i in range(5)) + "".join(f"line {i}\n" for i in range(5, 10))
    assert max(overlaps) == 1


# --- write ---

async def test_write_new_file(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    ctx = make_ctx(worktree=str(project))
    target = project / "a" / "b" / "new.txt"
    result = await write.run({"filePath": "a/b/new.txt", "content": "hi\n"}, ctx)
    assert target.read_text() == "hi\n"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~umask
    assert result.title == "a/b/new.txt"
    assert result.output == "Wrote file successfully."
    assert result.metadata == {"diagnostics": {}, "filepath": str(target), "exists": False}
    diff = HEAD.format(p=target) + "@@ -0,0 +1,1 @@\n+hi\n"
    assert recorder.asks == [Asked("edit", ["a/b/new.txt"], ["*"], {"filepath": str(target), "diff": diff})]


async def test_write_existing_needs_read(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "a.txt"
    target.write_bytes(b"old\r\n")
    ctx = make_ctx()
    message = await run_error(write, {"filePath": str(target), "content": "new\n"}, ctx)
    assert message == f"You must read file {target} before overwriting it. Use the Read tool first"
    read(ctx, target)
    result = await write.run({"filePath": str(target), "content": "new\n"}, ctx)
    assert result.metadata["exists"] is True
    assert target.read_bytes() == b"new\n"
    # write diffs the raw content (no line-ending normalisation).
    assert recorder.asks[-1].metadata["diff"] == HEAD.format(p=target) + "@@ -1,1 +1,1 @@\n-old\r\n+new\n"
    # Writing counts as a read, so an edit may follow.
    await edit.run({"filePath": str(target), "oldString": "new", "newString": "newer"}, ctx)
    assert target.read_text() == "newer\n"


async def test_write_stale_file(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "a.txt"
    target.write_text("x")
    ctx = make_ctx()
    ctx.file_times.read(str(target), READ_AT)
    os.utime(target, ns=(0, int(READ_AT * 1e9) + 1_000_000_000))
    message = await run_error(write, {"filePath": str(target), "content": "y"}, ctx)
    assert message.startswith(f"File {target} has been modified since it was last read.\n")


async def test_write_to_directory(make_ctx: MakeCtx, project: Path) -> None:
    (project / "d").mkdir()
    message = await run_error(write, {"filePath": "d", "content": "x"}, make_ctx())
    assert message == "EISDIR: illegal operation on a directory, read"


# --- multiedit ---

async def test_multiedit_applies_in_order(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "m.txt"
    target.write_text("a\nb\nc\n")
    ctx = make_ctx(worktree=str(project))
    read(ctx, target)
    result = await multiedit.run({"filePath": str(target), "edits": [
        {"filePath": str(target), "oldString": "a", "newString": "x"},
        {"filePath": str(target), "oldString": "x\nb", "newString": "y", "replaceAll": False},
    ]}, ctx)
    assert target.read_text() == "y\nc\n"
    assert result.output == "Edit applied successfully."
    assert result.title == "m.txt"
    first, second = result.metadata["results"]
    assert first["filediff"] == {"file": str(target), "before": "a\nb\nc\n", "after": "x\nb\nc\n",
                                 "additions": 1, "deletions": 1}
    assert second["diff"] == HEAD.format(p=target) + "@@ -1,3 +1,2 @@\n-x\n-b\n+y\n c\n"
    combined = HEAD.format(p=target) + "@@ -1,3 +1,2 @@\n-a\n-b\n+y\n c\n"
    assert result.metadata["diff"] == combined
    assert result.metadata["diagnostics"] == {}
    assert recorder.asks == [Asked("edit", ["m.txt"], ["*"], {"filepath": str(target), "diff": combined})]
    assert len(recorder.updates) == 1


async def test_multiedit_is_atomic(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "m.txt"
    target.write_text("a\nb\n")
    ctx = make_ctx()
    read(ctx, target)
    message = await run_error(multiedit, {"filePath": str(target), "edits": [
        {"filePath": str(target), "oldString": "a", "newString": "x"},
        {"filePath": str(target), "oldString": "missing", "newString": "y"},
    ]}, ctx)
    assert message == NOT_FOUND
    assert target.read_text() == "a\nb\n"
    assert recorder.asks == []
    message = await run_error(multiedit, {"filePath": str(target), "edits": [
        {"filePath": str(target), "oldString": "a", "newString": "x"},
        {"filePath": str(target), "oldString": "x", "newString": "x"},
    ]}, ctx)
    assert message == "No changes to apply: oldString and newString are identical."
    assert target.read_text() == "a\nb\n"


async def test_multiedit_checks_file_before_first_edit(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "m.txt"
    edits = [{"filePath": str(target), "oldString": "a", "newString": "x"}]
    assert await run_error(multiedit, {"filePath": str(target), "edits": edits}, make_ctx()) == (
        f"File {target} not found")
    target.write_text("a\n")
    assert await run_error(multiedit, {"filePath": str(target), "edits": edits}, make_ctx()) == (
        f"You must read file {target} before overwriting it. Use the Read tool first")
    assert await run_error(multiedit, {"filePath": str(target), "edits": []}, make_ctx()) == multiedit.NO_EDITS


async def test_multiedit_create_then_edit(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "sub" / "m.txt"
    result = await multiedit.run({"filePath": str(target), "edits": [
        {"filePath": str(target), "oldString": "", "newString": "one\r\ntwo\r\n"},
        {"filePath": str(target), "oldString": "two\n", "newString": "2\n"},
    ]}, make_ctx())
    assert target.read_bytes() == b"one\r\n2\r\n"
    assert result.metadata["results"][0]["filediff"]["before"] == ""
    assert result.metadata["filediff"]["after"] == "one\r\n2\r\n"


async def test_edit_empty_old_string_on_directory(make_ctx: MakeCtx, project: Path) -> None:
    (project / "d").mkdir()
    message = await run_error(edit, {"filePath": "d", "oldString": "", "newString": "x"}, make_ctx())
    assert message == f"EISDIR: illegal operation on a directory, open '{project / 'd'}'"
