"""`read`: attachment mime types as v1.2.27 names them, and absolute paths kept as written."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_agent.tools import edit, read
from sandbox_agent.tools.base import ToolContext, ToolError
from tests.unit.tools.conftest import Asked, Recorder

MakeCtx = Callable[..., ToolContext]


@pytest.mark.parametrize(("name", "mime"), [
    ("icon.bmp", "image/bmp"),
    ("favicon.ico", "image/vnd.microsoft.icon"),
    ("sprite.tga", "image/x-tga"),
    ("scan.PBM", "image/x-portable-bitmap"),
    ("photo.JPG", "image/jpeg"),
    ("doc.pdf", "application/pdf"),
])
async def test_attachment_mime_is_upstreams_name_for_the_extension(make_ctx: MakeCtx, project: Path, name: str,
                                                                    mime: str) -> None:
    data = bytes(range(256)) * 3
    (project / name).write_bytes(data)
    result = await read.run({"filePath": str(project / name)}, make_ctx())
    kind = "PDF" if mime == "application/pdf" else "Image"
    assert result.output == f"{kind} read successfully"
    assert [(a.mime, a.url) for a in result.attachments] == [
        (mime, f"data:{mime};base64,{base64.b64encode(data).decode()}")
    ]
    assert result.metadata == {"preview": f"{kind} read successfully", "truncated": False, "loaded": []}


@pytest.mark.parametrize("name", ["photo.cr2", "shape.svgz"])
async def test_extensions_upstream_does_not_call_images_are_read_as_files(make_ctx: MakeCtx, project: Path,
                                                                           name: str) -> None:
    (project / name).write_text("plain\n")
    result = await read.run({"filePath": str(project / name)}, make_ctx())
    assert result.attachments == []
    assert result.output == (f"<path>{project / name}</path>\n<type>file</type>\n<content>1: plain\n\n"
                             "(End of file - total 1 lines)\n</content>")


async def test_directory_with_trailing_slash_keeps_it(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "src").mkdir()
    (project / "src" / "a.txt").write_text("")
    given = f"{project}/src/"
    result = await read.run({"filePath": given}, make_ctx())
    assert result.output == f"<path>{given}</path>\n<type>directory</type>\n<entries>\na.txt\n\n(1 entries)\n</entries>"
    assert result.title == str(Path(str(project).lstrip("/")) / "src")
    assert recorder.asks == [Asked("read", [given], ["*"], {})]


async def test_absolute_path_is_not_normalised(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "sub").mkdir()
    (project / "f.txt").write_text("x\n")
    given = f"{project}/sub/../f.txt"
    result = await read.run({"filePath": given}, make_ctx())
    assert result.output.startswith(f"<path>{given}</path>\n<type>file</type>\n<content>1: x\n")
    assert result.title == str(Path(str(project).lstrip("/")) / "f.txt")
    assert recorder.asks == [Asked("read", [given], ["*"], {})]

    # The read counts for the same file however its path is spelled later.
    changed = await edit.run({"filePath": str(project / "f.txt"), "oldString": "x", "newString": "y"}, make_ctx())
    assert changed.output == "Edit applied successfully."


async def test_relative_path_is_resolved_and_normalised(make_ctx: MakeCtx, project: Path) -> None:
    (project / "src").mkdir()
    result = await read.run({"filePath": "./src/"}, make_ctx())
    assert result.output.startswith(f"<path>{project / 'src'}</path>\n<type>directory</type>")


async def test_missing_file_message_and_suggestions_use_the_given_path(make_ctx: MakeCtx, project: Path) -> None:
    (project / "sub").mkdir()
    (project / "notes.txt").write_text("x")
    given = f"{project}/sub/../notes"
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": given}, make_ctx())
    assert str(err.value) == f"File not found: {given}\n\nDid you mean one of these?\n{project / 'notes.txt'}"


async def test_external_glob_is_normalised_but_the_target_is_not(make_ctx: MakeCtx, project: Path, tmp_path: Path,
                                                                 recorder: Recorder) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("hi\n")
    given = f"{project}/../outside/f.txt"
    await read.run({"filePath": given}, make_ctx())
    glob = f"{outside}/*"
    assert recorder.asks[0] == Asked("external_directory", [glob], [glob],
                                     {"filepath": given, "parentDir": f"{project}/../outside"})


async def test_image_claims_nearby_instructions_without_showing_them(make_ctx: MakeCtx, project: Path) -> None:
    sub = project / "sub"
    sub.mkdir()
    (sub / "AGENTS.md").write_text("be nice\n")
    (sub / "pic.png").write_bytes(b"\x89PNG\r\n")
    (sub / "code.txt").write_text("x\n")
    ctx = make_ctx()
    image = await read.run({"filePath": str(sub / "pic.png")}, ctx)
    assert image.output == "Image read successfully"
    assert image.metadata["loaded"] == [str(sub / "AGENTS.md")]
    # Already loaded in this session: the text read next to it does not repeat it.
    text = await read.run({"filePath": str(sub / "code.txt")}, ctx)
    assert "<system-reminder>" not in text.output
    assert text.metadata["loaded"] == []


async def test_binary_extension_near_instructions_still_fails(make_ctx: MakeCtx, project: Path) -> None:
    sub = project / "sub"
    sub.mkdir()
    (sub / "AGENTS.md").write_text("be nice\n")
    (sub / "lib.so").write_bytes(b"")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(sub / "lib.so")}, make_ctx())
    assert str(err.value) == f"Cannot read binary file: {sub / 'lib.so'}"


async def test_directory_negative_limit_slices_like_javascript(make_ctx: MakeCtx, project: Path) -> None:
    for name in ["a", "b", "c"]:
        (project / name).write_text("")
    result = await read.run({"filePath": str(project), "limit": -1}, make_ctx())
    assert result.output == (f"<path>{project}</path>\n<type>directory</type>\n<entries>\na\nb\n\n"
                             "(Showing 2 of 3 entries. Use 'offset' parameter to read beyond entry 3)\n</entries>")
    assert result.metadata == {"preview": "a\nb", "truncated": True, "loaded": []}
