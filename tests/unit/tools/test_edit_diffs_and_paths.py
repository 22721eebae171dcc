"""`edit`, `write` and `multiedit`: the diff of a file made from an empty oldString, and absolute
paths kept as the model wrote them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent.tools import edit, multiedit, read, write
from sandbox_agent.tools.base import ToolContext, ToolError
from tests.unit.tools.conftest import Recorder

MakeCtx = Callable[..., ToolContext]
RULE = "=" * 67


def header(path: str) -> str:
    return f"Index: {path}\n{RULE}\n--- {path}\n+++ {path}\n"


async def test_empty_old_string_diff_keeps_crlf_of_new_string(make_ctx: MakeCtx, project: Path,
                                                              recorder: Recorder) -> None:
    path = str(project / "new.txt")
    result = await edit.run({"filePath": path, "oldString": "", "newString": "a\r\nb\r\n"}, make_ctx())
    expected = header(path) + "@@ -0,0 +1,2 @@\n+a\r\n+b\r\n"
    assert recorder.asks[0].metadata["diff"] == expected
    assert result.metadata["diff"] == expected
    assert result.metadata["filediff"] == {"file": path, "before": "", "after": "a\r\nb\r\n", "additions": 2,
                                           "deletions": 0}
    assert (project / "new.txt").read_bytes() == b"a\r\nb\r\n"


async def test_edit_of_existing_crlf_text_still_diffs_with_lf(make_ctx: MakeCtx, project: Path) -> None:
    target = project / "f.txt"
    target.write_bytes(b"one\r\ntwo\r\n")
    ctx = make_ctx()
    await read.run({"filePath": str(target)}, ctx)
    result = await edit.run({"filePath": str(target), "oldString": "two", "newString": "2"}, ctx)
    assert result.metadata["diff"] == header(str(target)) + "@@ -1,2 +1,2 @@\n one\n-two\n+2\n"


async def test_multiedit_results_diff_an_empty_old_string_like_edit(make_ctx: MakeCtx, project: Path) -> None:
    path = str(project / "m.txt")
    result = await multiedit.run({"filePath": path, "edits": [
        {"filePath": path, "oldString": "", "newString": "x\r\ny\r\n"},
        {"filePath": path, "oldString": "y", "newString": "z"},
    ]}, make_ctx())
    first, second = result.metadata["results"]
    assert first["diff"] == header(path) + "@@ -0,0 +1,2 @@\n+x\r\n+y\r\n"
    assert second["diff"] == header(path) + "@@ -1,2 +1,2 @@\n x\n-y\n+z\n"
    assert (project / "m.txt").read_bytes() == b"x\r\nz\r\n"


async def test_edit_messages_show_the_absolute_path_as_given(make_ctx: MakeCtx, project: Path) -> None:
    (project / "sub").mkdir()
    given = f"{project}/sub/../gone.txt"
    with pytest.raises(ToolError) as err:
        await edit.run({"filePath": given, "oldString": "a", "newString": "b"}, make_ctx())
    assert str(err.value) == f"File {given} not found"

    (project / "there.txt").write_text("a\n")
    given = f"{project}/./there.txt"
    with pytest.raises(ToolError) as err:
        await edit.run({"filePath": given, "oldString": "a", "newString": "b"}, make_ctx())
    assert str(err.value) == f"You must read file {given} before overwriting it. Use the Read tool first"


async def test_write_keeps_the_given_path_in_diff_and_metadata(make_ctx: MakeCtx, project: Path,
                                                              recorder: Recorder) -> None:
    given = f"{project}/./w.txt"
    result = await write.run({"filePath": given, "content": "hi\n"}, make_ctx())
    assert result.output == "Wrote file successfully."
    assert result.metadata == {"diagnostics": {}, "filepath": given, "exists": False}
    assert recorder.asks[0].patterns == [str(Path(str(project).lstrip("/")) / "w.txt")]
    assert recorder.asks[0].metadata == {"filepath": given, "diff": header(given) + "@@ -0,0 +1,1 @@\n+hi\n"}
    assert (project / "w.txt").read_text() == "hi\n"

    # Written counts as read, under any spelling of the path.
    again = await write.run({"filePath": str(project / "w.txt"), "content": "bye\n"}, make_ctx())
    assert again.metadata["exists"] is True
