"""Skill discovery as upstream does it: SKILL.md files with a `name` and `description` in their frontmatter.

Sources, in order (a later skill with the same name replaces the earlier one, keeping its place):
1. `.claude/skills/**/SKILL.md` and `.agents/skills/**/SKILL.md` under HOME, then in every directory
   from the project directory up to the worktree, nearest first (off with OPENCODE_DISABLE_EXTERNAL_SKILLS,
   OPENCODE_DISABLE_CLAUDE_CODE_SKILLS or OPENCODE_DISABLE_CLAUDE_CODE);
2. `{skill,skills}/**/SKILL.md` in each config dir;
3. `**/SKILL.md` under each of the session config's `skills.paths` (`~/` is HOME, relative is the project).
`skills.urls` cannot be fetched from a sandbox without network: each is reported.
Symlinked directories are followed; dot directories are searched only under `.claude`/`.agents`.
Matches within one search are taken in code-unit order of their paths (upstream's order is unspecified).

The frontmatter is parsed by a small YAML subset (see `frontmatter.parse_frontmatter`).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opencode_semantics.javascript import js_keys
from sandbox_agent.custom.discovery import flag, walk_up
from sandbox_agent.custom.files import LoadError
from sandbox_agent.custom.frontmatter import FrontmatterError, parse_frontmatter
from sandbox_agent.tools.collation import code_unit_key

SKILL_FILE = "SKILL.md"
EXTERNAL_DIRS = (".claude", ".agents")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    location: str
    """Absolute path of the SKILL.md file."""
    content: str
    """The markdown after the frontmatter."""


@dataclass
class SkillScan:
    skills: list[Skill] = field(default_factory=list)
    problems: list[LoadError] = field(default_factory=list)
    """Files and config entries that gave no skill, with the reason (upstream mostly logs these)."""
    dirs: list[str] = field(default_factory=list)
    """Directory of every valid SKILL.md, replaced duplicates included (upstream's `Skill.dirs()`)."""


def discover_skills(directory: str, worktree: str, *, config_dirs: Sequence[str], home: str,
                    env: Mapping[str, str], config: Mapping[str, Any]) -> SkillScan:
    found = _SkillSet()
    if not any(flag(env, name) for name in (
        "OPENCODE_DISABLE_EXTERNAL_SKILLS", "OPENCODE_DISABLE_CLAUDE_CODE_SKILLS", "OPENCODE_DISABLE_CLAUDE_CODE",
    )):
        for external in EXTERNAL_DIRS:
            found.add_all(_skill_files(posixpath.join(home, external), ["skills"], dot=True))
        for root in walk_up(EXTERNAL_DIRS, directory, worktree):
            found.add_all(_skill_files(root, ["skills"], dot=True))
    for config_dir in config_dirs:
        found.add_all(_skill_files(config_dir, ["skill", "skills"], dot=False))

    skills_config = config.get("skills")
    if not isinstance(skills_config, Mapping):
        skills_config = {}
    for entry in _strings(skills_config.get("paths")):
        expanded = posixpath.join(home, entry[2:]) if entry.startswith("~/") else entry
        resolved = posixpath.normpath(posixpath.join(directory, expanded))
        if not os.path.isdir(resolved):
            found.problems.append(LoadError(entry, f"skill path not found: {resolved}"))
            continue
        found.add_all(_skill_files(resolved, [""], dot=False))
    for url in _strings(skills_config.get("urls")):
        found.problems.append(LoadError(url, "skill URLs cannot be fetched: the sandbox has no network access"))
    return SkillScan(found.ordered(), found.problems, list(found.dirs))


def read_skill(path: str) -> Skill | None:
    """The skill a SKILL.md file defines; None when its frontmatter lacks a string `name` or `description`.

    Raises FrontmatterError (or OSError) when the file cannot be read or parsed.
    """
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        text = handle.read()
    data, content = parse_frontmatter(text)
    name, description = data.get("name"), data.get("description")
    if not isinstance(name, str) or not isinstance(description, str):
        return None
    return Skill(name=name, description=description, location=path, content=content)


class _SkillSet:
    """Skills by name with JavaScript object key order: integer-like names first, then first insertion."""

    def __init__(self) -> None:
        self.by_name: dict[str, Skill] = {}
        self.problems: list[LoadError] = []
        self.dirs: dict[str, None] = {}

    def add_all(self, paths: Iterable[str]) -> None:
        for path in paths:
            try:
                skill = read_skill(path)
            except (OSError, FrontmatterError) as exc:
                self.problems.append(LoadError(path, f"Failed to parse skill {path}: {exc}"))
                continue
            if skill is None:
                self.problems.append(LoadError(path, "skipped: the frontmatter has no string `name` and `description`"))
                continue
            self.dirs[posixpath.dirname(path)] = None
            self.by_name[skill.name] = skill

    def ordered(self) -> list[Skill]:
        return [self.by_name[name] for name in js_keys(self.by_name)]


def _strings(value: object) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def _skill_files(root: str, subdirs: Sequence[str], *, dot: bool) -> list[str]:
    """`{subdirs}/**/SKILL.md` under `root`, symlinked directories followed (each real directory once)."""
    found: list[str] = []
    seen: set[str] = set()
    for subdir in subdirs:
        start = posixpath.join(root, subdir) if subdir else root
        found += _walk(start.rstrip("/") or "/", dot, seen)
    return sorted(dict.fromkeys(found), key=code_unit_key)


def _walk(directory: str, dot: bool, seen: set[str]) -> Iterator[str]:
    real = os.path.realpath(directory)
    if real in seen:
        return
    seen.add(real)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: code_unit_key(e.name))
    except OSError:
        return
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError:
            continue
        if is_dir:
            if dot or not entry.name.startswith("."):
                yield from _walk(posixpath.join(directory, entry.name), dot, seen)
        elif entry.name == SKILL_FILE and os.path.isfile(entry.path):
            yield posixpath.join(directory, entry.name)
