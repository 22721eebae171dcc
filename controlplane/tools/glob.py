"""`glob`: files matching a glob pattern, newest first."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool


class GlobParams(BaseModel):
    pattern: str = Field(description="The glob pattern to match files against")
    path: str | None = Field(
        None,
        description=(
            "The directory to search in. If not specified, the current working directory will be used. "
            'IMPORTANT: Omit this field to use the default directory. DO NOT enter "undefined" or "null" - '
            "simply omit it for the default behavior. Must be a valid directory path if provided."
        ),
    )


TOOL = sandboxed_tool("glob", GlobParams)
