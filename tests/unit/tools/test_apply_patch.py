"""The apply_patch tool end to end on a real directory: node's error wording, adds, updates, moves, deletes,
verification before any write, permissions and external paths (the patch format itself is test_patch.py)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent.tools import apply_patch
from sandbox_agent.tools.apply_patch import node_error_message
from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.diffs import unified_diff
from tests.unit.tools.patch_support import patch

from .conftest import Recorder

MakeCtx = Callable[..., ToolContext]
HEADER = "Success. Updated the following files:\n"


async def run(ctx: ToolContext, text: str) -> ToolOutput:
    return await apply_patch.run({"patchText": text}, ctx)


async def fails(ctx: ToolContext, text: str) -> str:
    with pytest.raises(ToolError) as info:
        await run(ctx, text)
    return str(info.value)


def test_node_error_messages() -> None:
    assert node_error_message(FileNotFoundError(errno.ENOENT, "x"), "open", "/a b") == \
        "ENOENT: no such file or directory, open '/a b'"
    assert node_error_message(IsADirectoryError(errno.EISDIR, "x"), "read") == \
        "EISDIR: illegal operation on a directory, read"
    assert node_error_message(PermissionError(errno.EACCES, "x"), "unlink", "/f") == \
        "EACCES: permission denied, unlink '/f'"


@pytest.mark.parametrize("args", [{}, {"patchText": ""}])
async def test_patch_text_is_required(make_ctx: MakeCtx, args: dict[str, str]) -> None:
    with pytest.raises(ToolError) as info:
        await apply_patch.run(args, make_ctx())
    assert str(info.value) == "patchText is required"


async def test_parse_errors_and_empty_patches(make_ctx: MakeCtx, recorder: Recorder) -> None:
    ctx = make_ctx()
    assert await fails(ctx, "*** Add File: a\n+x") == \
        "apply_patch verification failed: Error: Invalid patch format: missing Begin/End markers"
    assert await fails(ctx, "*** Begin Patch\n*** End Patch") == "patch rejected: empty patch"
    assert await fails(ctx, "\r\n*** Begin Patch\r\n*** End Patch\r\n") == "patch rejected: empty patch"
    assert await fails(ctx, "*** Begin Patch\n\n*** End Patch") == "apply_patch verification failed: no hunks found"
    assert await fails(ctx, patch("*** Unknown: x")) == "apply_patch verification failed: no hunks found"
    assert recorder.asks == []


async def test_add_file_end_to_end(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    ctx = make_ctx(worktree=str(project))
    result = await run(ctx, patch("*** Add File: sub/dir/new.txt", "+hello", "+world"))
    target = project / "sub" / "dir" / "new.txt"
    assert target.read_text() == "hello\nworld\n"
    assert result.output == HEADER + "A sub/dir/new.txt"
    assert result.title == result.output
    diff = unified_diff(str(target), "", "hello\nworld\n")
    file_meta = {
        "filePath": str(target), "relativePath": "sub/dir/new.txt", "type": "add", "diff": diff,
        "before": "", "after": "hello\nworld\n", "additions": 2, "deletions": 0,
    }
    assert result.metadata == {"diff": diff + "\n", "files": [file_meta], "diagnostics": {}}
    [ask] = recorder.asks
    assert (ask.permission, ask.patterns, ask.always) == ("edit", ["sub/dir/new.txt"], ["*"])
    assert ask.metadata == {"filepath": "sub/dir/new.txt", "diff": diff + "\n", "files": [file_meta]}


async def test_add_literal_diff_and_file_mode(make_ctx: MakeCtx, project: Path) -> None:
    result = await run(make_ctx(worktree=str(project)), patch("*** Add File: a.txt", "+hello"))
    path = project / "a.txt"
    assert result.metadata["diff"] == (
        f"Index: {path}\n" + "=" * 67 + f"\n--- {path}\n+++ {path}\n@@ -0,0 +1,1 @@\n+hello\n\n"
    )
    assert (path.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


async def test_add_empty_file_and_overwrite_existing(make_ctx: MakeCtx, project: Path) -> None:
    (project / "exists.txt").write_text("old content\n")
    result = await run(make_ctx(worktree=str(project)), patch("*** Add File: empty.txt", "*** Add File: exists.txt",
                                                              "+new"))
    assert (project / "empty.txt").read_text() == ""
    assert (project / "exists.txt").read_text() == "new\n"
    assert result.output == HEADER + "A empty.txt\nA exists.txt"
    assert [f["before"] for f in result.metadata["files"]] == ["", ""]


async def test_update_end_to_end(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    target = project / "src" / "a.py"
    target.parent.mkdir()
    target.write_text("def f():\n    return 1\n\n\ndef g():\n    return 1\n")
    result = await run(make_ctx(worktree=str(project)), patch(
        "*** Update File: src/a.py", "@@ def g():", "-    return 1", "+    return 2",
    ))
    after = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert target.read_text() == after
    assert result.output == HEADER + "M src/a.py"
    [meta] = result.metadata["files"]
    assert meta["type"] == "update"
    assert (meta["additions"], meta["deletions"]) == (1, 1)
    assert meta["diff"] == unified_diff(str(target), "def f():\n    return 1\n\n\ndef g():\n    return 1\n", after)
    assert "movePath" not in meta
    assert recorder.asks[0].patterns == ["src/a.py"]


async def test_update_without_chunks_adds_missing_newline(make_ctx: MakeCtx, project: Path) -> None:
    (project / "a.txt").write_text("no newline")
    result = await run(make_ctx(worktree=str(project)), patch("*** Update File: a.txt", "-no newline", "+x"))
    assert (project / "a.txt").read_text() == "no newline\n"
    assert result.output == HEADER + "M a.txt"


async def test_update_in_crlf_file_writes_bare_newline(make_ctx: MakeCtx, project: Path) -> None:
    (project / "w.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    await run(make_ctx(worktree=str(project)), patch("*** Update File: w.txt", "@@", "-two", "+TWO"))
    assert (project / "w.txt").read_bytes() == b"one\r\nTWO\nthree\r\n"
    # Context lines are part of the replaced span too, so they lose their \r as well.
    await run(make_ctx(worktree=str(project)), patch("*** Update File: w.txt", "@@", " one", "-TWO", "+2"))
    assert (project / "w.txt").read_bytes() == b"one\n2\nthree\r\n"


async def test_move_end_to_end(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    source = project / "old" / "name.txt"
    source.parent.mkdir()
    source.write_text("a\nb\n")
    result = await run(make_ctx(worktree=str(project)), patch(
        "*** Update File: old/name.txt", "*** Move to: new/place/name.txt", "@@", "-b", "+B",
    ))
    dest = project / "new" / "place" / "name.txt"
    assert dest.read_text() == "a\nB\n"
    assert not source.exists()
    assert source.parent.is_dir()  # the emptied source directory stays
    assert result.output == HEADER + "M new/place/name.txt"
    [meta] = result.metadata["files"]
    assert meta["type"] == "move"
    assert meta["filePath"] == str(source)
    assert meta["movePath"] == str(dest)
    assert meta["relativePath"] == "new/place/name.txt"
    [ask] = recorder.asks
    assert ask.patterns == ["old/name.txt"]
    assert ask.checks == ["new/place/name.txt"]  # the destination's rules decide too, unshown
    assert ask.metadata["filepath"] == "old/name.txt"


async def test_delete_end_to_end(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "gone.txt").write_text("obsolete\n")
    result = await run(make_ctx(worktree=str(project)), patch("*** Delete File: gone.txt"))
    assert not (project / "gone.txt").exists()
    assert result.output == HEADER + "D gone.txt"
    [meta] = result.metadata["files"]
    assert (meta["type"], meta["before"], meta["after"]) == ("delete", "obsolete\n", "")
    assert (meta["additions"], meta["deletions"]) == (0, 2)
    assert meta["diff"] == unified_diff(str(project / "gone.txt"), "obsolete\n", "")
    assert recorder.asks[0].patterns == ["gone.txt"]


async def test_multi_file_summary_keeps_patch_order(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "m.txt").write_text("x\n")
    (project / "d.txt").write_text("bye\n")
    result = await run(make_ctx(worktree=str(project)), patch(
        "*** Delete File: d.txt",
        "*** Update File: m.txt", "@@", "-x", "+y",
        "*** Add File: a.txt", "+new",
    ))
    assert result.output == HEADER + "D d.txt\nM m.txt\nA a.txt"
    [ask] = recorder.asks
    assert ask.patterns == ["d.txt", "m.txt", "a.txt"]
    assert ask.metadata["filepath"] == "d.txt, m.txt, a.txt"
    assert ask.metadata["diff"] == "".join(f["diff"] + "\n" for f in result.metadata["files"])


async def test_paths_are_relative_to_the_worktree(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "pkg").mkdir()
    result = await run(make_ctx(worktree=str(project.parent)), patch("*** Add File: pkg/x.txt", "+x"))
    assert result.output == HEADER + "A project/pkg/x.txt"
    result = await run(make_ctx(), patch("*** Add File: y.txt", "+y"))
    assert result.output == HEADER + "A " + str(project / "y.txt").lstrip("/")
    assert recorder.asks[-1].patterns == [str(project / "y.txt").lstrip("/")]


async def test_failed_verification_writes_nothing(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "keep.txt").write_text("keep\n")
    (project / "b.txt").write_text("one\ntwo\n")
    message = await fails(make_ctx(worktree=str(project)), patch(
        "*** Delete File: keep.txt",
        "*** Update File: b.txt", "@@", "-three", "+3",
        "*** Add File: c.txt", "+c",
    ))
    assert message == ("apply_patch verification failed: Error: "
                       f"Failed to find expected lines in {project}/b.txt:\nthree")
    assert (project / "keep.txt").read_text() == "keep\n"
    assert (project / "b.txt").read_text() == "one\ntwo\n"
    assert not (project / "c.txt").exists()
    assert recorder.asks == []


async def test_missing_context_error(make_ctx: MakeCtx, project: Path) -> None:
    (project / "a.txt").write_text("a\n")
    message = await fails(make_ctx(), patch("*** Update File: a.txt", "@@ nope", "-a", "+b"))
    assert message == f"apply_patch verification failed: Error: Failed to find context 'nope' in {project}/a.txt"


async def test_update_missing_or_directory(make_ctx: MakeCtx, project: Path) -> None:
    (project / "dir").mkdir()
    for name in ("missing.txt", "dir"):
        message = await fails(make_ctx(), patch(f"*** Update File: {name}", "@@", "-a", "+b"))
        assert message == f"apply_patch verification failed: Failed to read file to update: {project}/{name}"


async def test_delete_errors_use_node_wording(make_ctx: MakeCtx, project: Path) -> None:
    (project / "dir").mkdir()
    assert await fails(make_ctx(), patch("*** Delete File: missing.txt")) == (
        f"apply_patch verification failed: Error: ENOENT: no such file or directory, open '{project}/missing.txt'"
    )
    assert await fails(make_ctx(), patch("*** Delete File: dir")) == (
        "apply_patch verification failed: Error: EISDIR: illegal operation on a directory, read"
    )
    assert (project / "dir").is_dir()


async def test_add_then_update_same_file_fails_verification(make_ctx: MakeCtx, project: Path) -> None:
    # Verification reads the disk, not the earlier hunks' results.
    message = await fails(make_ctx(), patch("*** Add File: n.txt", "+a", "*** Update File: n.txt", "@@", "-a", "+b"))
    assert message == f"apply_patch verification failed: Failed to read file to update: {project}/n.txt"
    assert not (project / "n.txt").exists()


async def test_denied_edit_writes_nothing(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "a.txt").write_text("a\n")
    recorder.deny.add("edit")
    message = await fails(make_ctx(), patch("*** Update File: a.txt", "@@", "-a", "+b", "*** Add File: n.txt", "+n"))
    assert message == "The user rejected permission to use this specific tool call."
    assert (project / "a.txt").read_text() == "a\n"
    assert not (project / "n.txt").exists()


async def test_external_paths_ask_external_directory_first(make_ctx: MakeCtx, project: Path,
                                                           recorder: Recorder) -> None:
    outside = project.parent / "outside"
    outside.mkdir()
    (outside / "src.txt").write_text("s\n")
    result = await run(make_ctx(), patch(
        "*** Add File: inside.txt", "+i",
        f"*** Update File: {outside}/src.txt", f"*** Move to: {outside}/deeper/dst.txt", "@@", "-s", "+S",
    ))
    assert [(a.permission, a.patterns, a.always) for a in recorder.asks] == [
        ("external_directory", [f"{outside}/*"], [f"{outside}/*"]),
        ("external_directory", [f"{outside}/deeper/*"], [f"{outside}/deeper/*"]),
        ("edit", [str(project / "inside.txt").lstrip("/"), f"{outside}/src.txt".lstrip("/")], ["*"]),
    ]
    assert recorder.asks[0].metadata == {"filepath": f"{outside}/src.txt", "parentDir": str(outside)}
    assert (outside / "deeper" / "dst.txt").read_text() == "S\n"
    assert not (outside / "src.txt").exists()
    inside, moved = str(project / "inside.txt").lstrip("/"), f"{outside}/deeper/dst.txt".lstrip("/")
    assert result.output == HEADER + f"A {inside}\nM {moved}"


async def test_denied_external_directory_writes_nothing(make_ctx: MakeCtx, project: Path,
                                                        recorder: Recorder) -> None:
    recorder.deny.add("external_directory")
    outside = project.parent / "elsewhere" / "x.txt"
    message = await fails(make_ctx(), patch("*** Add File: in.txt", "+i", f"*** Add File: {outside}", "+x"))
    assert message == "The user rejected permission to use this specific tool call."
    assert [a.permission for a in recorder.asks] == ["external_directory"]
    assert not (project / "in.txt").exists()
    assert not outside.exists()


async def test_heredoc_patch_through_the_tool(make_ctx: MakeCtx, project: Path) -> None:
    text = "cat <<'EOF'\n" + patch("*** Add File: h.txt", "+heredoc") + "\nEOF"
    result = await run(make_ctx(worktree=str(project)), text)
    assert result.output == HEADER + "A h.txt"
    assert (project / "h.txt").read_text() == "heredoc\n"


async def test_pure_addition_and_end_of_file_through_the_tool(make_ctx: MakeCtx, project: Path) -> None:
    (project / "c.py").write_text("import sys\n\nx = 1\nx = 1\n")
    await run(make_ctx(worktree=str(project)), patch(
        "*** Update File: c.py",
        "@@ import sys",
        "+import os",
        "@@",
        "-x = 1",
        "+x = 2",
        "*** End of File",
    ))
    assert (project / "c.py").read_text() == "import sys\nimport os\n\nx = 1\nx = 2\n"


async def test_unicode_and_invalid_utf8_survive(make_ctx: MakeCtx, project: Path) -> None:
    (project / "u.txt").write_bytes("caf\u00e9 \u201cquoted\u201d\n".encode() + b"\xff raw\n")
    await run(make_ctx(), patch("*** Update File: u.txt", "@@", '-caf\u00e9 "quoted"', "+tea"))
    assert (project / "u.txt").read_bytes() == b"tea\n\xef\xbf\xbd raw\n"


async def test_write_failures_after_approval_use_node_wording(make_ctx: MakeCtx, project: Path) -> None:
    (project / "taken").mkdir()
    (project / "plain.txt").write_text("p\n")
    assert await fails(make_ctx(), patch("*** Add File: taken", "+x")) == (
        f"EISDIR: illegal operation on a directory, open '{project}/taken'"
    )
    assert await fails(make_ctx(), patch("*** Add File: first.txt", "+1", "*** Add File: plain.txt/sub/x", "+x")) == (
        f"ENOTDIR: not a directory, mkdir '{project}/plain.txt/sub'"
    )
    assert await fails(make_ctx(), patch("*** Add File: plain.txt/x", "+x")) == (
        f"EEXIST: file already exists, mkdir '{project}/plain.txt'"
    )
    # Writes are not rolled back: hunks before the failing one stay applied, as upstream.
    assert (project / "first.txt").read_text() == "1\n"
