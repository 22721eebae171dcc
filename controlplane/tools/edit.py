"""`edit`: replaces text in a file (exact match first, then upstream's fuzzier replacers)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool


class EditParams(BaseModel):
    file_path: str = Field(alias="filePath", description="The absolute path to the file to modify")
    old_string: str = Field(alias="oldString", description="The text to replace")
    new_string: str = Field(
        alias="newString", description="The text to replace it with (must be different from oldString)"
    )
    replace_all: bool | None = Field(
        None, alias="replaceAll", description="Replace all occurrences of oldString (default false)"
    )


TOOL = sandboxed_tool("edit", EditParams)
