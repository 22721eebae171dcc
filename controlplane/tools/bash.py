"""`bash`: runs a shell command in the session's sandbox."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.core.calls.truncation import MAX_BYTES, MAX_LINES
from controlplane.tools.sandboxed import sandboxed_tool

WORKSPACE = "/workspace"
"""The project directory inside the sandbox: what upstream's `Instance.directory` is there."""


class BashParams(BaseModel):
    command: str = Field(description="The command to execute")
    timeout: float | None = Field(None, description="Optional timeout in milliseconds")
    workdir: str | None = Field(
        None,
        description=(
            f"The working directory to run the command in. Defaults to {WORKSPACE}. "
            "Use this instead of 'cd' commands."
        ),
    )
    description: str = Field(
        description=(
            "Clear, concise description of what this command does in 5-10 words. Examples:\n"
            "Input: ls\nOutput: Lists files in current directory\n\n"
            "Input: git status\nOutput: Shows working tree status\n\n"
            "Input: npm install\nOutput: Installs package dependencies\n\n"
            "Input: mkdir foo\nOutput: Creates directory 'foo'"
        )
    )


TOOL = sandboxed_tool("bash", BashParams, directory=WORKSPACE, maxLines=MAX_LINES, maxBytes=MAX_BYTES)
