"""`list`: a directory tree (upstream's `ls.ts`; defined but not registered in v1.2.27)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool


class ListParams(BaseModel):
    path: str | None = Field(
        None, description="The absolute path to the directory to list (must be absolute, not relative)"
    )
    ignore: list[str] | None = Field(None, description="List of glob patterns to ignore")


TOOL = sandboxed_tool("list", ListParams)
