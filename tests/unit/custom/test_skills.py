"""Skill discovery over a real temporary tree, and the frontmatter subset it parses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox_agent.custom.discovery import config_directories
from sandbox_agent.custom.files import LoadError
from sandbox_agent.custom.frontmatter import NOT_A_STRING, FrontmatterError, parse_frontmatter
from sandbox_agent.custom.skills import SkillScan, discover_skills


def skill(path: Path, name: str, description: str = "does things", body: str = "Body.\n") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    target = path / "SKILL.md"
    target.write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}")
    return target


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.global_dir = root / "global"
        self.repo = root / "repo"
        self.directory = self.repo / "pkg"
        for path in (self.home, self.global_dir, self.directory):
            path.mkdir(parents=True)

    def scan(self, env: dict[str, str] | None = None, config: dict[str, Any] | None = None) -> SkillScan:
        env = env or {}
        dirs = config_directories(str(self.directory), str(self.repo), global_dir=str(self.global_dir),
                                  home=str(self.home), env=env)
        return discover_skills(str(self.directory), str(self.repo), config_dirs=dirs, home=str(self.home),
                               env=env, config=config or {})


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path)


def names(scan: SkillScan) -> list[str]:
    return [s.name for s in scan.skills]


def test_every_source_in_upstream_order(tree: Tree) -> None:
    skill(tree.global_dir / "skills" / "g", "global-config")
    skill(tree.repo / ".opencode" / "skill" / "s1", "opencode-skill")
    skill(tree.directory / ".opencode" / "skills" / "deep" / "nested" / "s2", "opencode-skills")
    skill(tree.directory / ".agents" / "skills" / "a", "project-agents")
    skill(tree.directory / ".claude" / "skills" / "c", "project-claude")
    skill(tree.repo / ".claude" / "skills" / "r", "repo-claude")
    skill(tree.home / ".agents" / "skills" / "h2", "home-agents")
    skill(tree.home / ".claude" / "skills" / "h1", "home-claude")
    skill(tree.root / ".claude" / "skills" / "above", "above-the-worktree")
    skill(tree.root / "extra" / "x", "from-paths")
    scan = tree.scan(config={"skills": {"paths": ["../../extra"]}})
    assert names(scan) == [
        "home-claude", "home-agents", "project-claude", "project-agents", "repo-claude", "global-config",
        "opencode-skills", "opencode-skill", "from-paths",
    ]
    first = scan.skills[0]
    assert first.location == str(tree.home / ".claude" / "skills" / "h1" / "SKILL.md")
    assert (first.description, first.content) == ("does things", "Body.\n")
    assert scan.problems == []


def test_skill_md_directly_in_skills_dir_and_dot_dirs_only_under_external(tree: Tree) -> None:
    skill(tree.directory / ".opencode" / "skills", "top")
    skill(tree.directory / ".opencode" / "skills" / ".hidden", "hidden-opencode")
    skill(tree.directory / ".claude" / "skills" / ".hidden", "hidden-claude")
    (tree.directory / ".opencode" / "skills" / "lower").mkdir()
    (tree.directory / ".opencode" / "skills" / "lower" / "skill.md").write_text("---\nname: x\ndescription: y\n---\n")
    assert names(tree.scan()) == ["hidden-claude", "top"]


def test_later_duplicate_replaces_content_but_keeps_the_first_place(tree: Tree) -> None:
    skill(tree.home / ".claude" / "skills" / "one", "dup", "from home")
    skill(tree.home / ".claude" / "skills" / "two", "other")
    later = skill(tree.directory / ".opencode" / "skills" / "dup", "dup", "from project")
    scan = tree.scan()
    assert names(scan) == ["dup", "other"]
    assert (scan.skills[0].description, scan.skills[0].location) == ("from project", str(later))
    assert scan.dirs == [str(tree.home / ".claude/skills/one"), str(tree.home / ".claude/skills/two"),
                         str(later.parent)]


def test_integer_like_names_come_first_as_in_a_javascript_object(tree: Tree) -> None:
    for name in ["beta", "10", "2", "01", "alpha"]:
        skill(tree.directory / ".opencode" / "skills" / f"s-{name}", f'"{name}"')
    assert names(tree.scan()) == ["2", "10", "01", "alpha", "beta"]


def test_missing_or_non_string_frontmatter_is_skipped_and_reported(tree: Tree) -> None:
    base = tree.directory / ".opencode" / "skills"
    (base / "plain").mkdir(parents=True)
    (base / "plain" / "SKILL.md").write_text("# Just markdown\n")
    (base / "number").mkdir()
    (base / "number" / "SKILL.md").write_text("---\nname: 42\ndescription: numeric name\n---\n")
    (base / "nodesc").mkdir()
    (base / "nodesc" / "SKILL.md").write_text("---\nname: nodesc\n---\n")
    (base / "broken").mkdir()
    (base / "broken" / "SKILL.md").write_text("---\nname: b\n  description: indented\n---\n")
    skill(base / "ok", "ok")
    scan = tree.scan()
    assert names(scan) == ["ok"]
    missing = "skipped: the frontmatter has no string `name` and `description`"
    broken = base / "broken" / "SKILL.md"
    assert scan.problems == [
        LoadError(str(broken),
                  f"Failed to parse skill {broken}: bad indentation of a mapping entry: 'description: indented'"),
        LoadError(str(base / "nodesc" / "SKILL.md"), missing),
        LoadError(str(base / "number" / "SKILL.md"), missing),
        LoadError(str(base / "plain" / "SKILL.md"), missing),
    ]


@pytest.mark.parametrize("flag", ["OPENCODE_DISABLE_EXTERNAL_SKILLS", "OPENCODE_DISABLE_CLAUDE_CODE_SKILLS",
                                  "OPENCODE_DISABLE_CLAUDE_CODE"])
def test_external_skills_can_be_disabled(tree: Tree, flag: str) -> None:
    skill(tree.home / ".claude" / "skills" / "h", "home")
    skill(tree.directory / ".agents" / "skills" / "p", "project")
    skill(tree.directory / ".opencode" / "skills" / "o", "opencode")
    assert names(tree.scan({flag: "1"})) == ["opencode"]


def test_skills_paths_home_absolute_missing_and_urls(tree: Tree) -> None:
    skill(tree.home / "my-skills" / "a" / "b", "tilde")
    skill(tree.root / "abs" / "dir", "absolute")
    skill(tree.root / "abs" / ".dot" / "dir", "hidden-under-paths")
    scan = tree.scan(config={"skills": {
        "paths": ["~/my-skills", str(tree.root / "abs"), "nope", 7],
        "urls": ["https://example.invalid/skills/"],
    }})
    assert names(scan) == ["tilde", "absolute"]
    assert scan.problems == [
        LoadError("nope", f"skill path not found: {tree.directory / 'nope'}"),
        LoadError("https://example.invalid/skills/",
                  "skill URLs cannot be fetched: the sandbox has no network access"),
    ]


def test_symlinked_skill_dirs_are_followed_without_looping(tree: Tree) -> None:
    shared = tree.root / "shared"
    skill(shared / "linked", "linked")
    skills = tree.directory / ".opencode" / "skills"
    skills.mkdir(parents=True)
    (skills / "via-link").symlink_to(shared)
    (shared / "loop").symlink_to(shared)
    assert names(tree.scan()) == ["linked"]


def test_project_config_flag_also_hides_opencode_skills(tree: Tree) -> None:
    skill(tree.directory / ".opencode" / "skills" / "o", "opencode")
    skill(tree.global_dir / "skill" / "g", "global")
    assert names(tree.scan({"OPENCODE_DISABLE_PROJECT_CONFIG": "true"})) == ["global"]


# --- frontmatter ------------------------------------------------------------------------------------


def test_split_like_gray_matter() -> None:
    assert parse_frontmatter("---\nname: a\n---\n\nBody\n") == ({"name": "a"}, "\nBody\n")
    assert parse_frontmatter("\ufeff---\r\nname: a\r\n---\r\nBody") == ({"name": "a"}, "Body")
    assert parse_frontmatter("---\n---\nbody") == ({}, "body")
    assert parse_frontmatter("---\n# only a comment\n---\nbody") == ({}, "body")
    assert parse_frontmatter("no frontmatter\n---\n") == ({}, "no frontmatter\n---\n")
    assert parse_frontmatter("----\nname: a\n----\n") == ({}, "----\nname: a\n----\n")
    assert parse_frontmatter("---\nname: a\n") == ({"name": "a"}, "")
    assert parse_frontmatter('---json\n{"name": "j", "description": 3}\n---\nb') == (
        {"name": "j", "description": NOT_A_STRING}, "b")


@pytest.mark.parametrize(("yaml", "expected"), [
    ("plain words here", "plain words here"),
    ("value # a comment", "value"),
    ("value#not-a-comment", "value#not-a-comment"),
    ("'it''s quoted' # c", "it's quoted"),
    ('"tab\\there \\u00e9 \\"q\\""', 'tab\there é "q"'),
    ("Use when: the user asks # kept", "Use when: the user asks # kept"),
    ("ends with colon:", "ends with colon:"),
    ("a:b", "a:b"),
    ("~", None),
    ("null", None),
    ("", None),
    ("123", NOT_A_STRING),
    ("-1.5e3", NOT_A_STRING),
    ("0x1F", NOT_A_STRING),
    ("true", NOT_A_STRING),
    ("2024-01-31", NOT_A_STRING),
    ("[a, b]", NOT_A_STRING),
    ("{a: b}", NOT_A_STRING),
    ("'123'", "123"),
    ("yes", "yes"),
    ("1.2.3", "1.2.3"),
])
def test_single_line_values(yaml: str, expected: object) -> None:
    data, _ = parse_frontmatter(f"---\nname: {yaml}\n---\n")
    assert data["name"] == expected


@pytest.mark.parametrize(("block", "expected"), [
    ("|\n  line one\n    indented\n\n  line three\n", "line one\n  indented\n\nline three\n"),
    ("|-\n  keep no newline\n", "keep no newline"),
    ("|+\n  keep all\n\n", "keep all\n\n"),
    (">\n  folded\n  into one\n\n  new para\n", "folded into one\nnew para\n"),
    (">-\n  folded\n    more indented\n  back\n", "folded\n  more indented\nback"),
    ("|2\n   one extra space\n", " one extra space\n"),
    ("\n  on the next line\n  and continued\n", "on the next line and continued"),
    ("plain start\n  continued # comment\n", "plain start continued"),
    ("\n  nested: mapping\n", NOT_A_STRING),
    ("\n  - a list\n", NOT_A_STRING),
])
def test_multi_line_values(block: str, expected: object) -> None:
    data, content = parse_frontmatter(f"---\ndescription: {block}other: x\n---\nrest")
    assert data == {"description": expected, "other": "x"}
    assert content == "rest"


@pytest.mark.parametrize(("matter", "message"), [
    ("name: a\nname: b", 'duplicated mapping key "name"'),
    ("  indented: first", "unexpected indentation: 'indented: first'"),
    ("just text", "expected `key: value`, found 'just text'"),
    ("name: a\n  b: c", "bad indentation of a mapping entry: 'b: c'"),
    ("name: &anchor a", "anchors, aliases and tags are not supported: '&anchor a'"),
    ("name: 'open", "unterminated quoted value: \"'open\""),
    ("name: @at", "a plain value cannot start with '@'"),
    ('name: "\\q"', "unknown escape sequence in '\"\\\\q\"'"),
])
def test_unsupported_or_invalid_yaml_is_an_error(matter: str, message: str) -> None:
    with pytest.raises(FrontmatterError) as caught:
        parse_frontmatter(f"---\n{matter}\n---\n")
    assert str(caught.value) == message


def test_other_frontmatter_languages_are_errors() -> None:
    with pytest.raises(FrontmatterError, match='frontmatter language "toml" is not supported'):
        parse_frontmatter("---toml\nname = 'a'\n---\n")


# --- patterns met in published SKILL.md files, checked against gray-matter + js-yaml 3 + upstream's fallback ---


@pytest.mark.parametrize(("matter", "expected"), [
    # A plain value holding ": " fails js-yaml; upstream's fallback turns the line into a `|-` block, so the
    # indented lines after it stay as separate lines (more indentation kept).
    ("description: Pick me when: the build breaks\n  or a test flakes",
     "Pick me when: the build breaks\nor a test flakes"),
    ("description: Pick me when: x\n    deeper\n\n    again", "Pick me when: x\n  deeper\n\n  again"),
    ("description: Hooks:\n  pre and post", "Hooks:\npre and post"),
    # When another line sends the parse to the fallback, a value with any ":" keeps its ` #...` text.
    ("description: docs at http://x.test # see\nwhen: now: later", "docs at http://x.test # see"),
    # Starts a plain scalar may not have in YAML become text through the fallback when the value has a ":".
    ("description: `tool` CLI: runs it", "`tool` CLI: runs it"),
    ("description: @bot says: hi", "@bot says: hi"),
    ("description: *note* read: this", "*note* read: this"),
    ("description: | odd: header", "| odd: header"),
    # Quoted scalars over several lines fold: a break is a space, an empty line a newline.
    ("description: 'one''s first\n  second\n\n  third'", "one's first second\nthird"),
    ('description: "first\n  second \\\n  joined\n\n\n  last"', "first second joined\n\nlast"),
    # A sequence at the key's own indentation belongs to the key.
    ("description: d\ntags:\n- one\n- two\nextra: e", "d"),
    ("description: d\nkeys: # comment\n- one", "d"),
])
def test_published_skill_patterns(matter: str, expected: str) -> None:
    data, content = parse_frontmatter(f"---\nname: n\n{matter}\n---\nBody\n")
    assert data["name"] == "n"
    assert data["description"] == expected
    assert content == "Body\n"


@pytest.mark.parametrize(("value", "expected"), [
    ("0o17", "0o17"),  # js-yaml 3 has no `0o` octal
    ("2024-1-1", "2024-1-1"),  # a date needs two-digit month and day
    ("1:30", NOT_A_STRING),  # base 60
    ("017", NOT_A_STRING),
    ("1_000", NOT_A_STRING),
    (".5", NOT_A_STRING),
    ("1e3", NOT_A_STRING),
    ("2001-12-14 21:59:43.10 -5", NOT_A_STRING),
])
def test_implicit_types_as_js_yaml_3(value: str, expected: object) -> None:
    data, _ = parse_frontmatter(f"---\nname: {value}\ndescription: d\n---\n")
    assert data["name"] == expected


@pytest.mark.parametrize("matter", [
    "description: d\nargument-hint: a: b",  # the fallback only rewrites keys made of [A-Za-z0-9_]
    "description: %off",
    "description: ? what",
    "description: - item",
    "description: first # note\n  second",
    "description: first\n\tsecond",
])
def test_yaml_js_yaml_rejects_skips_the_skill(matter: str) -> None:
    with pytest.raises(FrontmatterError):
        parse_frontmatter(f"---\nname: n\n{matter}\n---\n")
