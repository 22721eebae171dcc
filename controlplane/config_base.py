"""What every section of the operator's settings shares: unknown keys are errors, values never change."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
