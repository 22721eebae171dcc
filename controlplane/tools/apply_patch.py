"""`apply_patch`: adds, deletes, updates and moves files from one patch text."""

from __future__ import annotations

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool


class ApplyPatchParams(BaseModel):
    patch_text: str = Field(alias="patchText", description="The full patch text that describes all changes to be made")


TOOL = sandboxed_tool("apply_patch", ApplyPatchParams)
