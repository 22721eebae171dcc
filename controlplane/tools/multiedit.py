"""`multiedit`: several edits to one file, applied all or none (upstream applies them one by one)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.edit import EditParams
from controlplane.tools.sandboxed import sandboxed_tool


class MultiEditParams(BaseModel):
    file_path: str = Field(alias="filePath", description="The absolute path to the file to modify")
    edits: list[EditParams] = Field(description="Array of edit operations to perform sequentially on the file")


TOOL = sandboxed_tool("multiedit", MultiEditParams)
