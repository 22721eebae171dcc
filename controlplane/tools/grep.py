"""`grep`: lines matching a regular expression, grouped by file, newest files first."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool


class GrepParams(BaseModel):
    pattern: str = Field(description="The regex pattern to search for in file contents")
    path: str | None = Field(None, description="The directory to search in. Defaults to the current working directory.")
    include: str | None = Field(
        None, description='File pattern to include in the search (e.g. "*.js", "*.{ts,tsx}")'
    )


TOOL = sandboxed_tool("grep", GrepParams)
