"""A workspace archive's project config: which files, in which order, and how each is read."""

from __future__ import annotations

import io
import json
import re
import tarfile
from typing import Any

import pytest

from controlplane.core.config import agent_markdown, project_config, project_files
from controlplane.core.sessions import workspace_archive
from controlplane.errors import InvalidArgumentError, ResourceExhaustedError
from tests.archives import tar_of

# Eight lines that alias their way to 100,000,000 values.
ALIAS_BOMB = "---\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n" for prev, name in zip("abcdefg", "bcdefgh", strict=True)
) + "---\n"


def config(files: dict[str, str], config_json: str = "") -> dict[str, Any]:
    text = project_files.session_config({k: v.encode() for k, v in files.items()}, config_json)
    return json.loads(text) if text else {}


def kept(archive: bytes) -> dict[str, bytes]:
    return workspace_archive.check(archive, 1000, 1 << 30, keep=project_files.wanted).kept


def test_layers_merge_from_the_root_files_up_to_the_callers_document() -> None:
    files = {
        "opencode.jsonc": '{"model": "a", "permission": {"bash": "ask", "read": "allow"}, "plugin": ["p1"]}',
        "opencode.json": '{"model": "b", "plugin": ["p2", "p1"]}',
        ".opencode/opencode.jsonc": '{"permission": {"bash": {"git *": "allow"}}}',
        ".opencode/opencode.json": '{"agent": {"review": {"description": "from json", "hidden": true}}}',
        ".opencode/agent/review.md": "---\ndescription: from markdown\n---\nReview.",
    }
    merged = config(files, '{"plugin": ["p3"], "agent": {"review": {"hidden": false}}}')
    assert merged["model"] == "b"
    assert merged["permission"] == {"bash": {"git *": "allow"}, "read": "allow"}
    assert merged["plugin"] == ["p1", "p2", "p3"]
    assert merged["agent"] == {
        "review": {"description": "from markdown", "hidden": False, "name": "review", "prompt": "Review."},
    }


def test_jsonc_comments_and_trailing_commas_are_read_everywhere() -> None:
    files = {"opencode.json": '{\n  // rules\n  "permission": {"edit": "deny",}, /* more */\n}'}
    assert config(files, '{"agent": {"x": {"mode": "subagent",},},}') == {
        "permission": {"edit": "deny"}, "agent": {"x": {"mode": "subagent"}},
    }
    # Alone, a JSONC config_json is stored as plain JSON; a plain one is kept as given.
    assert json.loads(project_files.session_config({}, '{"a": 1, // c\n}')) == {"a": 1}
    assert project_files.session_config({}, '{"a":   1}') == '{"a":   1}'
    assert project_files.session_config({}, "") == ""


@pytest.mark.parametrize(("files", "config_json", "message"), [
    ({"opencode.json": "{nope"}, "", "workspace opencode.json is not valid JSON: "),
    ({"opencode.json": "[1]"}, "", "workspace opencode.json must be a JSON object (an opencode.json document)"),
    ({}, "{", "config_json is not valid JSON: "),
    ({}, '"text"', "config_json must be a JSON object (an opencode.json document)"),
    ({".opencode/agent/a.md": "---\nmode: main\n---\n"}, "",
     'workspace .opencode/agent/a.md: `mode` must be primary, subagent or all, not "main"'),
    ({".opencode/agent/a.md": "---\ntemperature: hot\n---\n"}, "",
     'workspace .opencode/agent/a.md: `temperature` must be a number, not "hot"'),
    ({".opencode/agent/a.md": "---\ntools:\n  write: maybe\n---\n"}, "",
     "workspace .opencode/agent/a.md: `tools` must be an object of true/false values, not {\"write\": \"maybe\"}"),
    ({".opencode/agent/a.md": "---\npermission:\n  edit: sometimes\n---\n"}, "",
     "workspace .opencode/agent/a.md: `permission` must be allow, deny, ask or an object of them"),
    ({".opencode/agent/a.md": "---\ndescription: 2024-05-01\n---\n"}, "",
     'workspace .opencode/agent/a.md: `description` must be a string, not "2024-05-01T00:00:00.000Z"'),
    ({"opencode.json": '{"agent": {"b": {"temperature": "warm"}}}'}, "",
     'workspace opencode.json: agent.b: `temperature` must be a number, not "warm"'),
    ({}, '{"mode": {"m": {"hidden": "yes"}}}', 'config_json: mode.m: `hidden` must be true or false, not "yes"'),
    ({"opencode.json": '{"plugin": "one"}'}, "",
     'workspace opencode.json: `plugin` must be a list of strings, not "one"'),
    ({"opencode.json": '{"plugin": [["p", {}]]}'}, "", "workspace opencode.json: `plugin` must be a list of strings"),
    ({"opencode.json": '{"agent": []}'}, "", "workspace opencode.json: `agent` must be an object of agent settings"),
    ({".opencode/agent/a.md": ALIAS_BOMB}, "",
     "workspace .opencode/agent/a.md: the frontmatter expands past 4194304 characters and values (YAML aliases?)"),
    ({".opencode/agent/a.md": "---\na: &a\n  - *a\n---\n"}, "",
     "workspace .opencode/agent/a.md: the frontmatter nests deeper than 200 levels (YAML aliases?)"),
    ({".opencode/agent/a.md": "---\na: " + "[" * 30_000 + "]" * 30_000 + "\n---\n"}, "",
     "workspace .opencode/agent/a.md: the frontmatter nests deeper than 200 levels"),
    ({"opencode.json": '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}"}, "",
     "workspace opencode.json nests deeper than 200 levels"),
    ({}, '{"a": ' + "[" * 300 + "]" * 300 + "}", "config_json nests deeper than 200 levels"),
    ({"opencode.json": '{"agent": {"a": {"temperature": NaN}}}'}, "",
     "workspace opencode.json has a number JSON cannot"),
    ({}, '{"x": 1e999}', "config_json has a number JSON cannot hold (inf)"),
    ({"opencode.json": '{"instructions": ["\\udcff"]}'}, "", "the session's config holds an unpaired surrogate"),
    ({"opencode.json": '{"plugin": "' + "p" * 100_000 + '"}'}, "",
     'workspace opencode.json: `plugin` must be a list of strings, not "' + "p" * 119 + "..."),
    ({"opencode.json": '{"instructions": [' + ", ".join(['"{file:big.txt}"'] * 5) + "]}",
      "big.txt": "b" * 1_000_000}, "",
     "workspace opencode.json: its {file:} references come to more than 4194304 characters"),
    ({"opencode.json": '{"instructions": ["{file:./missing.md}"]}'}, "",
     'workspace opencode.json: bad file reference: "{file:./missing.md}": missing.md is not in the workspace archive'),
    ({".opencode/opencode.json": '{"instructions": ["{file:../../up.md}"]}'}, "",
     'workspace .opencode/opencode.json: bad file reference: "{file:../../up.md}": it is outside the workspace'),
    ({"opencode.json": '{"instructions": ["{file:~/notes.md}"]}'}, "",
     'workspace opencode.json: bad file reference: "{file:~/notes.md}": it is outside the workspace'),
])
def test_a_file_that_cannot_be_used_is_named(files: dict[str, str], config_json: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        config(files, config_json)
    assert str(info.value).startswith(message), str(info.value)


def test_markdown_agent_names_come_from_their_path_and_modes_are_primary() -> None:
    files = {
        ".opencode/agent/a.md": "just a prompt\n",
        ".opencode/agent/foo.md": "---\nname: My Agent\n---\n",  # the frontmatter's name wins
        ".opencode/agent/bar.md": "---\nname: 42\n---\n",
        ".opencode/agents/team/b.md": "---\nmode: subagent\n---\n",
        ".opencode/mode/c.md": "---\nmode: subagent\n---\nC",
        ".opencode/modes/d.md": "D",
        ".opencode/mode/nested/e.md": "not a mode: modes are not nested",
        ".opencode/agent/notes.txt": "not an agent",
        "docs/.opencode/agent/f.md": "not the workspace's config dir",
    }
    agents = config(files)["agent"]
    assert agents == {
        "a": {"name": "a", "prompt": "just a prompt"},
        "My Agent": {"name": "My Agent", "prompt": ""},
        "team/b": {"name": "team/b", "mode": "subagent", "prompt": ""},
        "c": {"name": "c", "mode": "primary", "prompt": "C"},
        "d": {"name": "d", "prompt": "D", "mode": "primary"},
        "42": {"name": 42, "prompt": ""},
    }


def test_substitutions_read_no_environment_and_files_from_the_archive() -> None:
    files = {
        "opencode.json": '{"instructions": ["{env:HOME}/a.md", "{file:notes/name.txt}.md"],\n'
                         '  // "{file:commented/out.txt}"\n'
                         '  "agent": {"x": {"prompt": "{file:./notes/prompt.md}"}}}',
        "notes/name.txt": "  style\n",
        "notes/prompt.md": 'Say "hi"\n\tthen stop.\n',
        ".opencode/opencode.json": '{"agent": {"y": {"prompt": "{file:../notes/name.txt}"}}}',
    }
    assert project_files.file_references({k: v.encode() for k, v in files.items()}) == {
        "notes/name.txt", "notes/prompt.md",
    }
    merged = config(files)
    assert merged["instructions"] == ["/a.md", "style.md"]
    assert merged["agent"]["x"]["prompt"] == 'Say "hi"\n\tthen stop.'
    assert merged["agent"]["y"]["prompt"] == "style"


def test_relative_plugins_of_the_config_dir_are_named_from_the_workspace() -> None:
    files = {
        "opencode.json": '{"plugin": ["./tools/a.ts", "shared", "p@1"]}',
        ".opencode/opencode.json": '{"plugin": ["./plugins/b.ts", "../c.ts", "shared", "p@2", "file:///x/d.ts"]}',
    }
    assert config(files)["plugin"] == [
        "./tools/a.ts", "shared", "p@1", "./.opencode/plugins/b.ts", "./c.ts", "p@2", "file:///x/d.ts",
    ]


def test_mode_sections_and_markdown_steps_merge_as_upstream_merges_them() -> None:
    files = {
        "opencode.json": '{"mode": {"m": {"description": "from the mode map", "mode": "subagent"}},'
                         ' "agent": {"m": {"description": "from the agent map"},'
                         ' "s": {"steps": 7}, "t": {"steps": 3}}}',
        ".opencode/agent/m.md": "---\ndescription: from markdown\n---\n",
        ".opencode/agent/s.md": "---\ndescription: no steps of its own\n---\n",
        ".opencode/agent/t.md": "---\nmaxSteps: 5\n---\n",
    }
    merged = config(files)
    assert "steps" not in merged["agent"]["s"]  # upstream's merge drops them
    assert merged["agent"]["t"]["steps"] == 5
    agents = project_config.agent_configs(merged)
    assert agents["m"]["description"] == "from the mode map"
    assert agents["m"]["mode"] == "primary"


def test_an_agents_tools_become_rules_within_its_own_file() -> None:
    files = {
        ".opencode/opencode.json": '{"agent": {"r": {"permission": {"edit": "deny", "bash": "ask"}}}}',
        ".opencode/agent/r.md": "---\ntools:\n  write: true\n  webfetch: false\npermission:\n  bash: deny\n---\n",
    }
    assert config(files)["agent"]["r"] == {
        "name": "r", "permission": {"edit": "allow", "bash": "deny", "webfetch": "deny"}, "prompt": "",
    }


def parse_agent(text: str) -> tuple[dict[str, Any], str]:
    return agent_markdown.parse_agent(text, agent_markdown.ExpansionBudget(1 << 20))


def test_frontmatter_reads_as_gray_matter_reads_it() -> None:
    data, prompt = parse_agent(
        "\ufeff---\n"
        "description: Use when: the user asks\n"  # not YAML; the second reading makes it text
        "flag: yes\n"  # js-yaml 3 has no yes/no booleans
        "on: true\n"
        "when: 2024-05-01\n"
        "1: one\n"
        "eq: =\n"
        "---\n\n  Body text.\n\n"
    )
    assert data == {"description": "Use when: the user asks", "flag": "yes", "on": True,
                    "when": "2024-05-01T00:00:00.000Z", "1": "one", "eq": "="}
    assert prompt == "Body text."
    assert parse_agent('---json\n{"mode": "all"}\n---\nP') == ({"mode": "all"}, "P")
    assert parse_agent("---\n---\nP") == ({}, "P")
    assert parse_agent("---\n# only a comment\n---\nP") == ({}, "P")
    assert parse_agent("---\ndescription: |\n  two\n  lines\n---\n")[0] == {"description": "two\nlines\n"}
    # Spread as JavaScript spreads a non-object into the agent's config.
    assert parse_agent("---\n- a\n- b\n---\nL") == ({"0": "a", "1": "b"}, "L")
    assert parse_agent("---\nab\n---\nS") == ({"0": "a", "1": "b"}, "S")
    assert parse_agent("---\n42\n---\nN") == ({}, "N")


@pytest.mark.parametrize("text", [
    "---\ndescription: \"unterminated\nmode: subagent\n---\nBody.\n",
    "---\ndescription: ok\n  mode: subagent\n tools:\n   write: false\n---\nBody.\n",
    "---\nmode: subagent\nBody without a closing fence.\n",
])
def test_frontmatter_that_is_not_yaml_makes_the_whole_file_the_prompt(text: str) -> None:
    assert parse_agent("\ufeff" + text) == ({}, text.strip())


def test_the_archive_keeps_the_files_as_extraction_leaves_them() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        def add(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))
        add("./opencode.json", b'{"a": 1}')
        add(".opencode/agent/x.md", b"first")
        add(".opencode/agent/x.md", b"second")
        add(".opencode/agent/gone.md", b"replaced by a link")
        add(".opencode/agent/gone.md", kind=tarfile.SYMTYPE, link="x.md")
        add("elsewhere/y.md", b"---\nmode: all\n---\n")
        add(".opencode/agents", kind=tarfile.SYMTYPE, link="../elsewhere")  # not followed
        add("src/main.py", b"print()")
    assert kept(buf.getvalue()) == {"opencode.json": b'{"a": 1}', ".opencode/agent/x.md": b"second"}


def test_a_large_file_is_refused_without_being_read_whole() -> None:
    big = "x" * (project_files.MAX_FILE_BYTES + 10)
    files = kept(tar_of({".opencode/agent/big.md": big}))
    assert len(files[".opencode/agent/big.md"]) == project_files.MAX_FILE_BYTES + 1
    with pytest.raises(InvalidArgumentError, match=r"big\.md is 1048577 bytes; a project config file may have at most"):
        project_files.session_config(files, "")


def test_unclosed_references_stay_linear_and_unread() -> None:
    text = "{env:" * 80_000 + '{"a": "{file:' + "{file:" * 60_000
    files = {"opencode.json": text.encode()}
    assert project_files.file_references(files) == set()
    with pytest.raises(InvalidArgumentError, match="is not valid JSON"):
        project_files.session_config(files, "")


def test_the_archive_refuses_more_project_config_than_it_may_keep() -> None:
    archive = tar_of({f".opencode/agent/a{i}.md": "x" * 1_000_000 for i in range(9)})
    with pytest.raises(ResourceExhaustedError, match="its project config files come to more than 8388608 bytes"):
        kept(archive)


@pytest.mark.parametrize(("files", "config_json", "agent"), [
    ({}, "", "build"),
    ({}, '{"agent": {"build": {"disable": true}}}', "plan"),
    ({".opencode/agent/dev.md": "---\nmode: primary\n---\n"}, '{"agent": {"build": {"disable": true}, '
     '"plan": {"disable": true}}}', "dev"),
    ({".opencode/agent/dev.md": "---\nmode: subagent\n---\n", ".opencode/agent/lead.md": "---\nhidden: true\n---\n",
      ".opencode/agent/main.md": "---\nmode: all\n---\n"},
     '{"agent": {"build": {"disable": true}, "plan": {"disable": true}}}', "main"),
    ({}, '{"default_agent": "plan"}', "plan"),
])
def test_the_default_agent_is_picked_as_upstream_picks_it(files: dict[str, str], config_json: str, agent: str) -> None:
    text = project_files.session_config({k: v.encode() for k, v in files.items()}, config_json)
    assert project_files.default_agent(text) == agent


@pytest.mark.parametrize(("config_json", "message"), [
    ('{"default_agent": "nobody"}', 'the config\'s default_agent "nobody" is not an agent'),
    ('{"default_agent": "explore"}', 'the config\'s default_agent "explore" is a subagent'),
    ('{"default_agent": "title"}', 'the config\'s default_agent "title" is hidden'),
    ('{"agent": {"build": {"disable": true}, "plan": {"disable": true}}}', "the config leaves no primary agent"),
])
def test_a_default_agent_that_cannot_run_a_session_is_refused(config_json: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        project_files.default_agent(project_files.session_config({}, config_json))
