"""`lsp`: code intelligence from a language server in the sandbox (experimental, behind a flag)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from controlplane.tools.sandboxed import sandboxed_tool

Operation = Literal[
    "goToDefinition", "findReferences", "hover", "documentSymbol", "workspaceSymbol", "goToImplementation",
    "prepareCallHierarchy", "incomingCalls", "outgoingCalls",
]


class LspParams(BaseModel):
    operation: Operation = Field(description="The LSP operation to perform")
    file_path: str = Field(alias="filePath", description="The absolute or relative path to the file")
    line: int = Field(ge=1, description="The line number (1-based, as shown in editors)")
    character: int = Field(ge=1, description="The character offset (1-based, as shown in editors)")


TOOL = sandboxed_tool("lsp", LspParams)
