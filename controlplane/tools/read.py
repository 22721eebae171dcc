"""`read`: a file's numbered lines, a directory's entries, or an image/PDF as an attachment."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from controlplane.core.definitions.schema import COERCE
from controlplane.tools.sandboxed import sandboxed_tool


class ReadParams(BaseModel):
    file_path: str = Field(alias="filePath", description="The absolute path to the file or directory to read")
    # Coerced like upstream's `z.coerce.number()`; unlike upstream, the coerced value is what runs (§14).
    offset: Annotated[float, COERCE] | None = Field(
        None, description="The line number to start reading from (1-indexed)"
    )
    limit: Annotated[float, COERCE] | None = Field(
        None, description="The maximum number of lines to read (defaults to 2000)"
    )


TOOL = sandboxed_tool("read", ReadParams)
