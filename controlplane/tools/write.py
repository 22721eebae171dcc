"""`write`: creates or overwrites a file."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool


class WriteParams(BaseModel):
    content: str = Field(description="The content to write to the file")
    file_path: str = Field(
        alias="filePath", description="The absolute path to the file to write (must be absolute, not relative)"
    )


TOOL = sandboxed_tool("write", WriteParams)
