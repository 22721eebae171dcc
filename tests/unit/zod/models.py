"""Pydantic counterparts of the `feature_*` zod schemas in schemas.mjs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.core.definitions.schema import COERCE


class FeatureValues(BaseModel):
    mode: Literal["text", "markdown", "html"] = Field("markdown", description="The format")
    kind: Literal["only"]
    code: Literal[1, 2, "x"] | None = None
    flag: bool = Field(False, description="A flag")
    order: list[str] = Field(default_factory=lambda: ["a"])


class FeatureNumbers(BaseModel):
    level: int = Field(ge=1, le=5, description="Level")
    ratio: float | None = Field(None, gt=0, lt=1)
    page: Annotated[int, COERCE] | None = Field(None, ge=1)
    count: int | None = None
    positive: int | None = Field(None, gt=0)
    half: float | None = Field(None, ge=0.5, le=1e21)


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Item name")
    count: int | None = Field(None, ge=0)


class Meta(BaseModel):
    model_config = ConfigDict(extra="allow")

    key: str


class FeatureNesting(BaseModel):
    name: str = Field(min_length=2, max_length=8)
    items: list[Item] = Field(min_length=1, max_length=3, description="Items")
    tags: list[Annotated[str, Field(min_length=1, description="A tag")]] | None = None
    meta: Meta | None = Field(None, description="Loose metadata")
    labels: dict[str, float] | None = None


class FeatureUnions(BaseModel):
    value: str | float | None = None
    note: str | None
    anything: Any = None
    short: Annotated[str, Field(min_length=3)] | bool | None = None


FEATURES: dict[str, type[BaseModel]] = {
    "feature_values": FeatureValues,
    "feature_numbers": FeatureNumbers,
    "feature_nesting": FeatureNesting,
    "feature_unions": FeatureUnions,
}
