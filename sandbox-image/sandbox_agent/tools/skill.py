"""The `skill` tool: hands the model a SKILL.md's instructions, its base directory and a sample of its files.

The skills are those of the session's code snapshot (read when the session was created or ReloadTools
ran: a SKILL.md the model writes later is not a skill). Without a snapshot (the tool driven directly)
they are discovered on the call, as the tool user, from the session's inputs carried in `ctx.extra`:
"config" (the session's opencode.json, for `skills.paths`), "env" (the session environment, for
OPENCODE_CONFIG_DIR and the OPENCODE_DISABLE_* flags), and optionally "global_dir" and "home".
"""

from __future__ import annotations

import functools
import os
import posixpath
from collections.abc import Mapping
from typing import Any

from sandbox_agent.custom.discovery import GLOBAL_DIR, HOME, config_directories
from sandbox_agent.custom.skills import SkillScan, discover_skills
from sandbox_agent.tools.base import ToolContext, ToolError, ToolOutput
from sandbox_agent.tools.glob import rg_files

SAMPLED_FILES = 10
# The bytes Bun's (and Node's) pathToFileURL leaves as they are in a POSIX path.
_URL_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_.-!$&'()*+,;=:@")


async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    name = str(args["name"])
    scan = ctx.state.skills
    if scan is None:
        scan = await ctx.io(functools.partial(
            scan_skills, ctx.directory, ctx.worktree, global_dir=str(ctx.extra.get("global_dir") or GLOBAL_DIR),
            home=str(ctx.extra.get("home") or HOME), env=_mapping(ctx.extra.get("env")),
            config=_mapping(ctx.extra.get("config")),
        ))
    skill = next((s for s in scan.skills if s.name == name), None)
    if skill is None:
        available = ", ".join(s.name for s in scan.skills)
        raise ToolError(f'Skill "{name}" not found. Available skills: {available or "none"}')

    await ctx.ask("skill", [name], [name], {})

    directory = posixpath.dirname(skill.location)
    listed = await rg_files(ctx, directory, [])
    # Upstream drops any path merely containing "SKILL.md" (e.g. `old/SKILL.md.bak`), not only the file itself.
    sampled = [posixpath.normpath(posixpath.join(directory, f)) for f in listed if "SKILL.md" not in f]
    files = "\n".join(f"<file>{path}</file>" for path in sampled[:SAMPLED_FILES])
    output = "\n".join([
        f'<skill_content name="{skill.name}">',
        f"# Skill: {skill.name}",
        "",
        skill.content.strip(),
        "",
        f"Base directory for this skill: {file_url(directory)}",
        "Relative paths in this skill (e.g., scripts/, reference/) are relative to this base directory.",
        "Note: file list is sampled.",
        "",
        "<skill_files>",
        files,
        "</skill_files>",
        "</skill_content>",
    ])
    return ToolOutput(title=f"Loaded skill: {skill.name}", output=output,
                      metadata={"name": skill.name, "dir": directory})


def scan_skills(directory: str, worktree: str, *, global_dir: str = GLOBAL_DIR, home: str = HOME,
                env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> SkillScan:
    """Every skill of a session, with what could not be loaded (blocking: run it through the tool user's io)."""
    env = env or {}
    dirs = config_directories(directory, worktree, global_dir=global_dir, home=home, env=env)
    return discover_skills(directory, worktree, config_dirs=dirs, home=home, env=env, config=config or {})


def file_url(path: str) -> str:
    """`file://` URL of an absolute POSIX path, percent-encoded like Node's `pathToFileURL`."""
    return "file://" + "".join(chr(b) if b in _URL_SAFE else f"%{b:02X}" for b in os.fsencode(path))


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}
