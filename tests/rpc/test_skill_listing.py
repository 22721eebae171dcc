"""The `skill` tool's description lists the session's own skills, filtered by the calling agent's rules."""

from __future__ import annotations

import json

import pytest

from tests.archives import tar_of
from tests.planes import Plane

SKILLS = {
    ".opencode/skill/release-notes/SKILL.md": "---\nname: release-notes\ndescription: Writes release notes\n---\n"
                                              "Collect the merged changes.\n",
    ".opencode/skill/release-notes/template.md": "# Notes\n",
    ".claude/skills/db-migrate/SKILL.md": "---\nname: db-migrate\ndescription: Plans a schema migration\n---\n"
                                          "Check the current schema first.\n",
}


@pytest.fixture
def plane(either_plane: Plane) -> Plane:
    return either_plane


async def skill_description(plane: Plane, session_id: str, agent: str = "") -> tuple[str, dict[str, object]]:
    listed = await plane.client.list_tools(session_id, agent=agent)
    skill = next(t for t in listed.tools if t.id == "skill")
    return skill.description, json.loads(skill.parameters_json_schema)


async def test_description_lists_both_skill_locations_and_the_call_loads_one(plane: Plane) -> None:
    session = await plane.client.create_session(workspace_archive=tar_of(SKILLS))
    description, schema = await skill_description(plane, session.id)
    # External (.claude) skills come before the project's config-dir ones, as upstream scans them.
    assert description.endswith(
        "## Available Skills\n"
        "- **db-migrate**: Plans a schema migration\n"
        "- **release-notes**: Writes release notes"
    ), description
    names = schema["properties"]["name"]["description"]  # type: ignore[index]
    assert names == "The name of the skill from available_skills (e.g., 'db-migrate', 'release-notes', ...)"
    out = await plane.client.execute_tool(session.id, "skill", {"name": "release-notes"})
    assert out.output.startswith('<skill_content name="release-notes">\n# Skill: release-notes\n\n'
                                 "Collect the merged changes.\n"), out.output
    assert "template.md</file>" in out.output
    await plane.client.delete_session(session.id)


async def test_a_denied_skill_is_not_listed_and_no_skills_says_so(plane: Plane) -> None:
    config = json.dumps({"permission": {"skill": {"*": "allow", "db-*": "deny"}}})
    session = await plane.client.create_session(workspace_archive=tar_of(SKILLS), config_json=config)
    description, _ = await skill_description(plane, session.id)
    assert description.endswith("## Available Skills\n- **release-notes**: Writes release notes"), description
    empty = await plane.client.create_session()
    description, schema = await skill_description(plane, empty.id)
    assert description.endswith("No skills are currently available."), description
    assert schema["properties"]["name"]["description"] == "The name of the skill from available_skills"  # type: ignore[index]
    await plane.client.delete_session(session.id)
    await plane.client.delete_session(empty.id)


async def test_published_frontmatter_patterns_list_as_upstream_parses_them(plane: Plane) -> None:
    """An unquoted "a: b" value goes through upstream's fallback (its indented lines kept as lines); a hyphenated
    key the fallback cannot rewrite skips the skill; CRLF and a zero-indented list parse."""
    files = {
        ".opencode/skill/triage/SKILL.md": "---\nname: triage\ndescription: Use when: a bug report arrives\n"
                                           "  or a test flakes\n---\nSort it first.\n",
        ".opencode/skill/broken/SKILL.md": "---\nname: broken\ndescription: d\nargument-hint: a: b\n---\nx\n",
        ".opencode/skill/windows/SKILL.md": "---\r\nname: windows\r\ndescription: 'Folded\r\n  quoted'\r\n"
                                            "tags:\r\n- a\r\n---\r\nCRLF body\r\n",
    }
    session = await plane.client.create_session(workspace_archive=tar_of(files))
    description, _ = await skill_description(plane, session.id)
    assert description.endswith(
        "## Available Skills\n"
        "- **triage**: Use when: a bug report arrives\nor a test flakes\n"
        "- **windows**: Folded quoted"
    ), description
    out = await plane.client.execute_tool(session.id, "skill", {"name": "windows"})
    assert out.output.startswith('<skill_content name="windows">\n# Skill: windows\n\nCRLF body\n'), out.output
    await plane.client.delete_session(session.id)
