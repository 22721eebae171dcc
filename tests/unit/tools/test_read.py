"""The read tool through `run` on a file: envelopes, paging, caps, line endings, binary sniffing, media.

Missing and outside paths are in test_read_missing_and_external.py, directories in test_read_directories.py,
instruction files in test_read_instructions.py.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from sandbox_agent.tools import read
from sandbox_agent.tools.base import ToolError
from sandbox_agent.tools.collation import utf16_prefix
from tests.unit.tools.read_support import MakeCtx, envelope

from .conftest import Asked, Recorder


async def test_small_file(make_ctx: MakeCtx, project: Path, recorder: Recorder) -> None:
    (project / "a.txt").write_text("foo\nbar\n")
    ctx = make_ctx()
    result = await read.run({"filePath": str(project / "a.txt")}, ctx)
    assert result.output == envelope(project / "a.txt", "1: foo\n2: bar\n\n(End of file - total 2 lines)")
    assert result.metadata == {"preview": "foo\nbar", "truncated": False, "loaded": []}
    assert result.attachments == []
    assert recorder.asks == [Asked("read", [str(project / "a.txt")], ["*"], {})]
    assert ctx.file_times.last_read(str(project / "a.txt")) is not None


async def test_relative_path_and_title(make_ctx: MakeCtx, project: Path) -> None:
    (project / "sub").mkdir()
    (project / "sub" / "b.txt").write_text("x")
    result = await read.run({"filePath": "sub/b.txt"}, make_ctx(worktree=str(project)))
    assert result.title == "sub/b.txt"
    assert result.output == envelope(project / "sub" / "b.txt", "1: x\n\n(End of file - total 1 lines)")
    # Outside git the worktree is "/", so the title is the path relative to "/".
    result = await read.run({"filePath": "sub/b.txt"}, make_ctx())
    assert result.title == str(project / "sub" / "b.txt").lstrip("/")


async def test_empty_file(make_ctx: MakeCtx, project: Path) -> None:
    (project / "empty.txt").write_bytes(b"")
    result = await read.run({"filePath": str(project / "empty.txt")}, make_ctx())
    assert result.output == f"<path>{project / 'empty.txt'}</path>\n<type>file</type>\n<content>\n\n" \
                            "(End of file - total 0 lines)\n</content>"
    assert result.metadata["preview"] == ""


async def test_empty_file_with_offset_two_is_out_of_range(make_ctx: MakeCtx, project: Path) -> None:
    (project / "empty.txt").write_bytes(b"")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "empty.txt"), "offset": 2}, make_ctx())
    assert str(err.value) == "Offset 2 is out of range for this file (0 lines)"


async def test_offset_and_limit_paging(make_ctx: MakeCtx, project: Path) -> None:
    (project / "n.txt").write_text("".join(f"line{i}\n" for i in range(1, 11)))
    path = project / "n.txt"
    result = await read.run({"filePath": str(path), "offset": 3, "limit": 4}, make_ctx())
    body = "3: line3\n4: line4\n5: line5\n6: line6\n\n(Showing lines 3-6 of 10. Use offset=7 to continue.)"
    assert result.output == envelope(path, body)
    assert result.metadata["truncated"] is True
    assert result.metadata["preview"] == "line3\nline4\nline5\nline6"

    result = await read.run({"filePath": str(path), "offset": 7, "limit": 4}, make_ctx())
    assert result.output == envelope(path, "7: line7\n8: line8\n9: line9\n10: line10\n\n(End of file - total 10 lines)")
    assert result.metadata["truncated"] is False

    result = await read.run({"filePath": str(path), "offset": 10}, make_ctx())
    assert result.output == envelope(path, "10: line10\n\n(End of file - total 10 lines)")


async def test_offset_out_of_range(make_ctx: MakeCtx, project: Path) -> None:
    (project / "n.txt").write_text("a\nb\nc\n")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "n.txt"), "offset": 4}, make_ctx())
    assert str(err.value) == "Offset 4 is out of range for this file (3 lines)"


@pytest.mark.parametrize("offset", [0, -3])
async def test_offset_below_one(make_ctx: MakeCtx, project: Path, recorder: Recorder, offset: int) -> None:
    (project / "n.txt").write_text("a\n")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "n.txt"), "offset": offset}, make_ctx())
    assert str(err.value) == "offset must be greater than or equal to 1"
    assert recorder.asks == []


async def test_default_limit_is_2000_lines(make_ctx: MakeCtx, project: Path) -> None:
    (project / "long.txt").write_text("".join(f"{i}\n" for i in range(1, 2501)))
    result = await read.run({"filePath": str(project / "long.txt")}, make_ctx())
    assert result.output.endswith("2000: 2000\n\n(Showing lines 1-2000 of 2500. Use offset=2001 to continue.)"
                                  "\n</content>")
    assert "2001: " not in result.output
    assert result.metadata["preview"] == "\n".join(str(i) for i in range(1, 21))


async def test_byte_cap(make_ctx: MakeCtx, project: Path) -> None:
    # 100 lines of 1000 bytes: 51 lines cost 51*1000 + 50 newlines = 51050 bytes, a 52nd would exceed 51200.
    (project / "big.txt").write_text("".join("x" * 1000 + "\n" for _ in range(100)))
    path = project / "big.txt"
    result = await read.run({"filePath": str(path)}, make_ctx())
    assert result.output.endswith(f"51: {'x' * 1000}\n\n(Output capped at 50 KB. Showing lines 1-51. "
                                  "Use offset=52 to continue.)\n</content>")
    assert "52: " not in result.output
    assert result.metadata["truncated"] is True

    result = await read.run({"filePath": str(path), "offset": 52}, make_ctx())
    assert "(Output capped at 50 KB. Showing lines 52-100. Use offset=101 to continue.)" not in result.output
    assert result.output.endswith("(End of file - total 100 lines)\n</content>")


async def test_byte_cap_counts_utf8_bytes(make_ctx: MakeCtx, project: Path) -> None:
    # "é" is 2 bytes: 25 lines of 1000 é cost 25*2000 + 24 = 50024 bytes; the 26th would exceed 51200.
    (project / "u.txt").write_text("".join("é" * 1000 + "\n" for _ in range(30)), encoding="utf-8")
    result = await read.run({"filePath": str(project / "u.txt")}, make_ctx())
    assert "(Output capped at 50 KB. Showing lines 1-25. Use offset=26 to continue.)" in result.output


@pytest.mark.parametrize(("last", "shown"), [(1175, 26), (1176, 25)])
async def test_byte_cap_exact_boundary(make_ctx: MakeCtx, project: Path, last: int, shown: int) -> None:
    # 25 lines of 2000 bytes plus 24 newlines are 50024 bytes; a 26th line of 1175 bytes (and its newline)
    # brings the total to exactly 51200, which is still allowed.
    (project / "edge.txt").write_text("".join("x" * 2000 + "\n" for _ in range(25)) + "y" * last + "\nz\n")
    result = await read.run({"filePath": str(project / "edge.txt")}, make_ctx())
    assert result.output.endswith(f"(Output capped at 50 KB. Showing lines 1-{shown}. "
                                  f"Use offset={shown + 1} to continue.)\n</content>")


async def test_long_line_is_cut(make_ctx: MakeCtx, project: Path) -> None:
    (project / "wide.txt").write_text("a" * 2000 + "\n" + "b" * 2001 + "\n")
    result = await read.run({"filePath": str(project / "wide.txt")}, make_ctx())
    body = f"1: {'a' * 2000}\n2: {'b' * 2000}... (line truncated to 2000 chars)\n\n(End of file - total 2 lines)"
    assert result.output == envelope(project / "wide.txt", body)
    assert result.metadata["preview"] == "a" * 2000 + "\n" + "b" * 2000 + "... (line truncated to 2000 chars)"


async def test_long_line_counts_utf16_units(make_ctx: MakeCtx, project: Path) -> None:
    # 1500 emoji are 3000 UTF-16 units: JavaScript cuts after 1000 of them.
    (project / "emoji.txt").write_text("😀" * 1500, encoding="utf-8")
    result = await read.run({"filePath": str(project / "emoji.txt")}, make_ctx())
    assert f"1: {'😀' * 1000}... (line truncated to 2000 chars)\n\n" in result.output


def test_utf16_prefix_splitting_a_pair() -> None:
    assert utf16_prefix("a😀b", 2) == "a\ufffd"
    assert utf16_prefix("a😀b", 3) == "a😀"
    assert utf16_prefix("abc", 5) == "abc"


async def test_huge_single_line_stays_bounded(make_ctx: MakeCtx, project: Path) -> None:
    (project / "huge.txt").write_bytes(b"q" * (5 * 1024 * 1024) + b"\nend\n")
    result = await read.run({"filePath": str(project / "huge.txt")}, make_ctx())
    body = f"1: {'q' * 2000}... (line truncated to 2000 chars)\n2: end\n\n(End of file - total 2 lines)"
    assert result.output == envelope(project / "huge.txt", body)


async def test_line_endings(make_ctx: MakeCtx, project: Path) -> None:
    (project / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree")
    result = await read.run({"filePath": str(project / "crlf.txt")}, make_ctx())
    assert result.output == envelope(project / "crlf.txt", "1: one\n2: two\n3: three\n\n(End of file - total 3 lines)")

    (project / "cr.txt").write_bytes(b"a\rb\nc\n")
    result = await read.run({"filePath": str(project / "cr.txt")}, make_ctx())
    assert result.output == envelope(project / "cr.txt", "1: a\n2: b\n3: c\n\n(End of file - total 3 lines)")

    (project / "blank.txt").write_bytes(b"\n\n\r\r\nx\r")
    result = await read.run({"filePath": str(project / "blank.txt")}, make_ctx())
    assert result.output == envelope(project / "blank.txt",
                                     "1: \n2: \n3: \n4: \n5: x\n\n(End of file - total 5 lines)")


async def test_crlf_split_across_chunks(make_ctx: MakeCtx, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read, "CHUNK_SIZE", 3)
    (project / "c.txt").write_bytes(b"ab\r\ncd\r\r\nef\xc3\xa9gh\r")
    monkeypatch.setattr(read, "SAMPLE_SIZE", 3)
    result = await read.run({"filePath": str(project / "c.txt")}, make_ctx())
    assert result.output == envelope(project / "c.txt", "1: ab\n2: cd\n3: \n4: efégh\n\n(End of file - total 4 lines)")


async def test_invalid_utf8_is_replaced(make_ctx: MakeCtx, project: Path) -> None:
    (project / "latin1.txt").write_bytes(b"caf\xe9\n")
    result = await read.run({"filePath": str(project / "latin1.txt")}, make_ctx())
    assert result.output == envelope(project / "latin1.txt", "1: caf\ufffd\n\n(End of file - total 1 lines)")


@pytest.mark.parametrize("name", ["x.zip", "lib.so", "x.PYC", "data.dat", "a.docx"])
async def test_binary_by_extension(make_ctx: MakeCtx, project: Path, name: str) -> None:
    (project / name).write_text("plain text really\n")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / name)}, make_ctx())
    assert str(err.value) == f"Cannot read binary file: {project / name}"


async def test_empty_file_with_binary_extension_is_binary(make_ctx: MakeCtx, project: Path) -> None:
    (project / "empty.dat").write_bytes(b"")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "empty.dat")}, make_ctx())
    assert str(err.value) == f"Cannot read binary file: {project / 'empty.dat'}"


async def test_binary_by_content(make_ctx: MakeCtx, project: Path) -> None:
    (project / "nul.txt").write_bytes(b"hello\x00world")
    with pytest.raises(ToolError, match=r"^Cannot read binary file: "):
        await read.run({"filePath": str(project / "nul.txt")}, make_ctx())

    # 31 control bytes in 100 are more than 30%; 30 are not.
    (project / "ctl31.txt").write_bytes(b"\x01" * 31 + b"a" * 69)
    with pytest.raises(ToolError, match=r"^Cannot read binary file: "):
        await read.run({"filePath": str(project / "ctl31.txt")}, make_ctx())
    (project / "ctl30.txt").write_bytes(b"\x1f" * 30 + b"a" * 70)
    result = await read.run({"filePath": str(project / "ctl30.txt")}, make_ctx())
    assert result.output.endswith("(End of file - total 1 lines)\n</content>")

    # Tabs, newlines and carriage returns (9-13) are not control bytes for this purpose.
    (project / "ws.txt").write_bytes(b"\t\n\x0b\x0c\r" * 50)
    await read.run({"filePath": str(project / "ws.txt")}, make_ctx())


async def test_nul_after_first_4096_bytes_is_text(make_ctx: MakeCtx, project: Path) -> None:
    (project / "late.txt").write_bytes(b"a" * 4096 + b"\x00\n")
    result = await read.run({"filePath": str(project / "late.txt")}, make_ctx())
    body = f"1: {'a' * 2000}... (line truncated to 2000 chars)\n\n(End of file - total 1 lines)"
    assert result.output == envelope(project / "late.txt", body)


async def test_image_attachment(make_ctx: MakeCtx, project: Path) -> None:
    data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 10
    (project / "pic.PNG").write_bytes(data)
    ctx = make_ctx()
    result = await read.run({"filePath": str(project / "pic.PNG")}, ctx)
    assert result.output == "Image read successfully"
    assert result.metadata == {"preview": "Image read successfully", "truncated": False, "loaded": []}
    assert len(result.attachments) == 1
    attachment = result.attachments[0]
    assert attachment.mime == "image/png"
    assert attachment.url == "data:image/png;base64," + base64.b64encode(data).decode()
    assert ctx.file_times.last_read(str(project / "pic.PNG")) is None


async def test_pdf_attachment(make_ctx: MakeCtx, project: Path) -> None:
    (project / "doc.pdf").write_bytes(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    result = await read.run({"filePath": str(project / "doc.pdf")}, make_ctx())
    assert result.output == "PDF read successfully"
    assert result.attachments[0].mime == "application/pdf"
    assert result.attachments[0].url.startswith("data:application/pdf;base64,JVBERi0xLjQK")


async def test_svg_is_text(make_ctx: MakeCtx, project: Path) -> None:
    (project / "logo.svg").write_text("<svg/>\n")
    result = await read.run({"filePath": str(project / "logo.svg")}, make_ctx())
    assert result.output == envelope(project / "logo.svg", "1: <svg/>\n\n(End of file - total 1 lines)")
    assert result.attachments == []


async def test_offset_and_limit_as_whole_floats(make_ctx: MakeCtx, project: Path) -> None:
    (project / "n.txt").write_text("a\nb\nc\n")
    result = await read.run({"filePath": str(project / "n.txt"), "offset": 2.0, "limit": 1.0}, make_ctx())
    assert result.output == envelope(project / "n.txt", "2: b\n\n(Showing lines 2-2 of 3. Use offset=3 to continue.)")
    with pytest.raises(ToolError) as err:
        await read.run({"filePath": str(project / "n.txt"), "offset": 1.5}, make_ctx())
    assert str(err.value) == "offset must be a whole number, got 1.5"


@pytest.mark.parametrize("chunk", [1, 2, 5, 1 << 20])
async def test_total_is_counted_past_the_page(make_ctx: MakeCtx, project: Path, monkeypatch: pytest.MonkeyPatch,
                                             chunk: int) -> None:
    monkeypatch.setattr(read, "SAMPLE_SIZE", chunk)
    monkeypatch.setattr(read, "CHUNK_SIZE", chunk)
    # Ten lines: breaks are \r\n, \r and \n, a \r\n pair may be split across chunks, the last line has none.
    (project / "m.txt").write_bytes(b"a\r\nb\r\nc\rd\n\r\n\re\r\r\nf\ng")
    path = project / "m.txt"
    result = await read.run({"filePath": str(path), "limit": 2}, make_ctx())
    assert result.output == envelope(path, "1: a\n2: b\n\n(Showing lines 1-2 of 10. Use offset=3 to continue.)")
    result = await read.run({"filePath": str(path), "offset": 9, "limit": 1}, make_ctx())
    assert result.output == envelope(path, "9: f\n\n(Showing lines 9-9 of 10. Use offset=10 to continue.)")
    result = await read.run({"filePath": str(path), "offset": 5, "limit": 4}, make_ctx())
    body = "5: \n6: \n7: e\n8: \n\n(Showing lines 5-8 of 10. Use offset=9 to continue.)"
    assert result.output == envelope(path, body)
    result = await read.run({"filePath": str(path), "offset": 10, "limit": 1}, make_ctx())
    assert result.output == envelope(path, "10: g\n\n(End of file - total 10 lines)")
