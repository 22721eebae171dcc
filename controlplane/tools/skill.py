"""`skill`: loads a SKILL.md's instructions (the files are read in the sandbox, where the skills live)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field, create_model

from controlplane.tools.describe import description
from controlplane.tools.sandboxed import sandboxed_tool

NO_SKILLS = "No skills are currently available."
NAME_DESCRIPTION = "The name of the skill from available_skills"


class SkillParams(BaseModel):
    name: str = Field(description=NAME_DESCRIPTION)


def describe_skills(skills: Sequence[tuple[str, str]]) -> str:
    """The tool description for these (name, description) pairs: the skills the agent may load, in order."""
    if not skills:
        listing = NO_SKILLS
    else:
        listing = "\n".join(["## Available Skills", *(f"- **{name}**: {text}" for name, text in skills)])
    return description("skill", skills=listing)


def skill_parameters(names: Sequence[str]) -> type[BaseModel]:
    """The parameters, whose `name` description gives up to three of the listed skills as examples."""
    if not names:
        return SkillParams
    examples = ", ".join(f"'{name}'" for name in names[:3])
    return create_model(
        "SkillParams", __base__=BaseModel,
        name=(str, Field(description=f"{NAME_DESCRIPTION} (e.g., {examples}, ...)")),
    )


TOOL = sandboxed_tool("skill", SkillParams, skills=NO_SKILLS)
"""Lists no skills: the session's skills are known only once its sandbox has been scanned (`describe_skills`)."""
