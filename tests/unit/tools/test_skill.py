"""The agent-side `skill` tool over real files, with real `rg` sampling the skill's directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.calls.tool import InitContext
from controlplane.tools.skill import TOOL, describe_skills, skill_parameters
from sandbox_agent.tools import skill as skill_tool
from sandbox_agent.tools.base import ToolContext, ToolError

from .conftest import Asked, Recorder

MakeCtx = Callable[..., ToolContext]


def write_skill(directory: Path, name: str, description: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}")
    return directory


@pytest.fixture
def ctx_for(make_ctx: MakeCtx, project: Path, tmp_path: Path) -> Callable[..., ToolContext]:
    """A context whose worktree is the project, with HOME and the global config dir inside tmp_path."""
    home, global_dir = tmp_path / "home", tmp_path / "global"
    home.mkdir()
    global_dir.mkdir()

    def make(**extra: Any) -> ToolContext:
        extra.setdefault("home", str(home))
        extra.setdefault("global_dir", str(global_dir))
        return make_ctx(worktree=str(project), **extra)

    return make


async def test_exact_output_with_sampled_file(ctx_for: Callable[..., ToolContext], project: Path,
                                              recorder: Recorder) -> None:
    directory = write_skill(project / ".opencode" / "skills" / "pdf", "pdf", "Work with PDFs",
                            "\n\n# PDF\n\nRun scripts/extract.py.\n\n")
    (directory / "scripts").mkdir()
    (directory / "scripts" / "extract.py").write_text("print(1)\n")
    result = await skill_tool.run({"name": "pdf"}, ctx_for())
    assert result.title == "Loaded skill: pdf"
    assert result.output == (
        '<skill_content name="pdf">\n'
        "# Skill: pdf\n"
        "\n"
        "# PDF\n\nRun scripts/extract.py.\n"
        "\n"
        f"Base directory for this skill: file://{directory}\n"
        "Relative paths in this skill (e.g., scripts/, reference/) are relative to this base directory.\n"
        "Note: file list is sampled.\n"
        "\n"
        "<skill_files>\n"
        f"<file>{directory}/scripts/extract.py</file>\n"
        "</skill_files>\n"
        "</skill_content>"
    )
    assert result.metadata == {"name": "pdf", "dir": str(directory)}
    assert recorder.asks == [Asked("skill", ["pdf"], ["pdf"], {})]


async def test_no_other_files_leaves_an_empty_line(ctx_for: Callable[..., ToolContext], project: Path) -> None:
    directory = write_skill(project / ".claude" / "skills" / "solo", "solo", "alone", "Only me.")
    result = await skill_tool.run({"name": "solo"}, ctx_for())
    assert result.output.endswith("Note: file list is sampled.\n\n<skill_files>\n\n</skill_files>\n</skill_content>")
    assert f"file://{directory}\n" in result.output


async def test_at_most_ten_files_hidden_included_skill_md_names_excluded(
    ctx_for: Callable[..., ToolContext], project: Path,
) -> None:
    directory = write_skill(project / ".agents" / "skills" / "big", "big", "many files", "Body")
    expected = set()
    for index in range(12):
        (directory / f"f{index:02}.txt").write_text("x")
        expected.add(f"{directory}/f{index:02}.txt")
    (directory / ".hidden").mkdir()
    (directory / ".hidden" / "conf").write_text("x")
    expected.add(f"{directory}/.hidden/conf")
    (directory / "old").mkdir()
    (directory / "old" / "SKILL.md.bak").write_text("x")
    (directory / "MYSKILL.md").write_text("x")
    result = await skill_tool.run({"name": "big"}, ctx_for())
    listing = result.output.split("<skill_files>\n", 1)[1].split("\n</skill_files>", 1)[0].split("\n")
    assert len(listing) == 10
    paths = [line.removeprefix("<file>").removesuffix("</file>") for line in listing]
    assert len(set(paths)) == 10
    assert set(paths) <= expected


async def test_base_directory_is_a_percent_encoded_file_url(ctx_for: Callable[..., ToolContext],
                                                             project: Path) -> None:
    directory = write_skill(project / ".opencode" / "skill" / "with space#1", "spaced", "d", "b")
    result = await skill_tool.run({"name": "spaced"}, ctx_for())
    encoded = str(directory).replace(" ", "%20").replace("#", "%23")
    assert f"Base directory for this skill: file://{encoded}\n" in result.output
    assert result.metadata["dir"] == str(directory)


async def test_unknown_skill_lists_every_name(ctx_for: Callable[..., ToolContext], project: Path,
                                              recorder: Recorder, tmp_path: Path) -> None:
    write_skill(project / ".opencode" / "skills" / "b", "beta", "d", "b")
    write_skill(tmp_path / "home" / ".claude" / "skills" / "a", "alpha", "d", "b")
    with pytest.raises(ToolError) as caught:
        await skill_tool.run({"name": "gamma"}, ctx_for())
    assert str(caught.value) == 'Skill "gamma" not found. Available skills: alpha, beta'
    assert recorder.asks == []


async def test_unknown_skill_without_any_skills_says_none(ctx_for: Callable[..., ToolContext]) -> None:
    with pytest.raises(ToolError) as caught:
        await skill_tool.run({"name": "x"}, ctx_for())
    assert str(caught.value) == 'Skill "x" not found. Available skills: none'


async def test_denied_ask_fails_the_call(ctx_for: Callable[..., ToolContext], project: Path,
                                         recorder: Recorder) -> None:
    write_skill(project / ".opencode" / "skills" / "s", "secret", "d", "b")
    recorder.deny.add("skill")
    with pytest.raises(ToolError) as caught:
        await skill_tool.run({"name": "secret"}, ctx_for())
    assert str(caught.value) == "The user rejected permission to use this specific tool call."
    assert recorder.asks == [Asked("skill", ["secret"], ["secret"], {})]


async def test_session_config_and_env_reach_discovery(ctx_for: Callable[..., ToolContext], project: Path,
                                                      tmp_path: Path) -> None:
    write_skill(project / "team-skills" / "t", "team", "from skills.paths", "T")
    config_dir = tmp_path / "config-dir"
    write_skill(config_dir / "skills" / "c", "configured", "from OPENCODE_CONFIG_DIR", "C")
    write_skill(project / ".claude" / "skills" / "x", "external", "d", "b")
    ctx = ctx_for(config={"skills": {"paths": ["team-skills"]}},
                  env={"OPENCODE_CONFIG_DIR": str(config_dir), "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1"})
    result = await skill_tool.run({"name": "team"}, ctx)
    assert "# Skill: team\n\nT\n" in result.output
    with pytest.raises(ToolError) as caught:
        await skill_tool.run({"name": "external"}, ctx)
    assert str(caught.value) == 'Skill "external" not found. Available skills: configured, team'


async def test_the_later_duplicate_is_the_one_loaded(ctx_for: Callable[..., ToolContext], project: Path,
                                                     tmp_path: Path) -> None:
    write_skill(tmp_path / "home" / ".claude" / "skills" / "d", "dup", "first", "FIRST")
    write_skill(project / ".opencode" / "skills" / "d", "dup", "second", "SECOND")
    result = await skill_tool.run({"name": "dup"}, ctx_for())
    assert "# Skill: dup\n\nSECOND\n" in result.output
    assert skill_tool.scan_skills(str(project), str(project), home=str(tmp_path / "home"),
                                  global_dir=str(tmp_path / "global")).skills[0].description == "second"


def test_list_skills_order_and_fields(project: Path, tmp_path: Path) -> None:
    write_skill(project / ".opencode" / "skills" / "b", "b-skill", "B things", "b")
    write_skill(tmp_path / "global" / "skill" / "a", "a-skill", "A things", "a")
    found = skill_tool.scan_skills(str(project), str(project), home=str(tmp_path / "home"),
                                   global_dir=str(tmp_path / "global")).skills
    assert [(s.name, s.description, s.location) for s in found] == [
        ("a-skill", "A things", str(tmp_path / "global" / "skill" / "a" / "SKILL.md")),
        ("b-skill", "B things", str(project / ".opencode" / "skills" / "b" / "SKILL.md")),
    ]


# --- control-plane side ---------------------------------------------------------------------------


def test_description_lists_skills_or_says_none() -> None:
    listed = describe_skills([("pdf", "Work with PDFs"), ("git", "Git $HOME ${tricks}")])
    assert listed.endswith("\n\n## Available Skills\n- **pdf**: Work with PDFs\n- **git**: Git $HOME ${tricks}")
    assert listed.startswith("Loads a skill: ")
    empty = describe_skills([])
    assert empty.endswith("\n\nNo skills are currently available.")
    assert "${skills}" not in empty


async def test_tool_definition_and_parameter_hint() -> None:
    definition = await TOOL.init(InitContext())
    assert definition.description == describe_skills([])
    assert definition.schema()["properties"] == {
        "name": {"type": "string", "description": "The name of the skill from available_skills"},
    }
    hinted = skill_parameters(["a", "b", "c", "d"]).model_json_schema()["properties"]["name"]["description"]
    assert hinted == "The name of the skill from available_skills (e.g., 'a', 'b', 'c', ...)"
    one = skill_parameters(["only"]).model_json_schema()["properties"]["name"]["description"]
    assert one == "The name of the skill from available_skills (e.g., 'only', ...)"
