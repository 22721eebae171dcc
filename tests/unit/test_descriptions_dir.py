"""`tools.descriptions_dir`: an operator's `<tool id>.txt` files replace built-in descriptions (placeholders filled
as in the built-in texts); a file naming no built-in tool, an empty one or a stray entry is refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane import app
from controlplane.config import load_settings
from controlplane.core.calls.tool import InitContext
from controlplane.errors import ConfigError
from controlplane.tools import catalog
from controlplane.tools.description_overrides import load_descriptions


def settings_with(directory: Path) -> catalog.ToolSettings:
    return app.tool_settings(load_settings(None, data_dir=directory.parent, tools={"descriptions_dir": directory}))


async def description_of(tools: catalog.ToolSettings, tool_id: str) -> str:
    return (await catalog.implemented(tools)[tool_id].init(InitContext(agent=None))).description


async def test_a_file_replaces_the_description_with_placeholders_filled(tmp_path: Path) -> None:
    texts = tmp_path / "descriptions"
    texts.mkdir()
    (texts / "read.txt").write_text("Reads a file, in this site's words.\n")
    (texts / "bash.txt").write_text("Runs commands in ${directory}; output past ${maxLines} lines is cut.\n")
    (texts / "todoread.txt").write_text("Lists the todos.\n")  # unlisted tools can be described too
    (texts / ".gitkeep").write_text("")
    configured = settings_with(texts)
    assert await description_of(configured, "read") == "Reads a file, in this site's words."
    bash = await description_of(configured, "bash")
    assert bash.startswith("Runs commands in /workspace; output past 2000 lines is cut.")
    assert "${" not in bash
    assert await description_of(configured, "todoread") == "Lists the todos."
    default = catalog.ToolSettings()
    assert await description_of(default, "read") != "Reads a file, in this site's words."
    assert await description_of(configured, "glob") == await description_of(default, "glob")


@pytest.mark.parametrize(("name", "content", "message"), [
    ("reed.txt", "x", "no built-in tool has the id 'reed'"),
    ("read.md", "x", "read.md: not a <tool id>.txt file"),
    ("read.txt", "  \n", "read.txt: empty"),
    ("read.txt", b"\xff\xfe", "read.txt: unreadable"),
])
def test_a_bad_entry_is_refused_at_start(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    texts = tmp_path / "descriptions"
    texts.mkdir()
    (texts / "glob.txt").write_text("fine\n")
    entry = texts / name
    entry.write_bytes(content) if isinstance(content, bytes) else entry.write_text(content)
    with pytest.raises(ConfigError, match=r"tools\.descriptions_dir") as raised:
        settings_with(texts)
    assert message in str(raised.value)
    assert "built-in tool ids: " in str(raised.value)


def test_a_missing_directory_and_an_unknown_key_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        load_descriptions(tmp_path / "missing", catalog.tool_ids())
    with pytest.raises(ConfigError, match="descriptions_directory"):
        load_settings(None, tools={"descriptions_directory": str(tmp_path)})
    assert load_descriptions(None, catalog.tool_ids()) == {}
