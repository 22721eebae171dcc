"""The read tool on a directory: entries in ICU's locale order, paging, an empty directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_agent.tools import read
from sandbox_agent.tools.collation import locale_key
from tests.unit.tools.read_support import MakeCtx

ORDER_EXAMPLE = ["_under", ".hidden", "10.txt", "9.txt", "a.txt", "apple", "Apple2", "B.txt", "éclair", "Zed"]


def test_locale_order_example() -> None:
    assert sorted(reversed(ORDER_EXAMPLE), key=locale_key) == ORDER_EXAMPLE
    assert sorted(sorted(ORDER_EXAMPLE), key=locale_key) == ORDER_EXAMPLE


@pytest.mark.parametrize("ordered", [
    ["a", "A", "á", "Á", "ä", "Ä", "ab", "aB", "Ab", "AB"],
    [" a", "a", "a b", "a_b", "a-b", "a\u2013b", "a.b", "a~b", "a$b", "a€b", "a1b", "ab", "a\u03b1b", "a\u0434b",
     "a中b"],
    ["ae", "aé", "Åë", "æ", "aez", "af"],
    ["ss", "sś", "ß", "ssa", "st"],
    ["e", "é", "è", "ê", "ë", "f"],
    ["'", "\u2019", "'a", "\u2019a", "x\u2019", "x'a", "x\u2019a", "x'b"],
])
def test_locale_order_matches_icu(ordered: list[str]) -> None:
    assert sorted(reversed(ordered), key=locale_key) == ordered


async def test_directory_listing(make_ctx: MakeCtx, project: Path, tmp_path: Path) -> None:
    for name in ORDER_EXAMPLE:
        (project / name).write_text("x")
    (project / "sub").mkdir()
    (project / "Docs").mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, project / "link")
    os.symlink(project / "a.txt", project / "alias")
    os.symlink(tmp_path / "dangling", project / "broken")
    result = await read.run({"filePath": str(project)}, make_ctx())
    entries = ["_under", ".hidden", "10.txt", "9.txt", "a.txt", "alias", "apple", "Apple2", "B.txt", "broken",
               "Docs/", "éclair", "link/", "sub/", "Zed"]
    assert result.output == (f"<path>{project}</path>\n<type>directory</type>\n<entries>\n" + "\n".join(entries)
                             + "\n\n(15 entries)\n</entries>")
    assert result.metadata == {"preview": "\n".join(entries), "truncated": False, "loaded": []}


async def test_directory_paging(make_ctx: MakeCtx, project: Path) -> None:
    for i in range(25):
        (project / f"f{i:02d}").write_text("")
    ctx = make_ctx()
    result = await read.run({"filePath": ".", "offset": 3, "limit": 5}, ctx)
    names = [f"f{i:02d}" for i in range(2, 7)]
    assert result.output == (f"<path>{project}</path>\n<type>directory</type>\n<entries>\n" + "\n".join(names)
                             + "\n\n(Showing 5 of 25 entries. Use 'offset' parameter to read beyond entry 8)"
                             + "\n</entries>")
    assert result.metadata["truncated"] is True

    result = await read.run({"filePath": str(project)}, make_ctx())
    assert result.metadata["preview"] == "\n".join(f"f{i:02d}" for i in range(20))
    assert result.output.endswith("f24\n\n(25 entries)\n</entries>")
    assert ctx.file_times.last_read(str(project)) is None


async def test_empty_directory(make_ctx: MakeCtx, project: Path) -> None:
    (project / "void").mkdir()
    result = await read.run({"filePath": str(project / "void")}, make_ctx())
    assert result.output == (f"<path>{project / 'void'}</path>\n<type>directory</type>\n<entries>\n\n\n"
                             "(0 entries)\n</entries>")
