"""Hypothesis profiles (`fast` in `make test`, `soak` in `make soak`) and a local plane for the fuzzers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz.harness import FuzzPlane, fuzz_plane

SOAK = os.environ.get("OCSB_SOAK") == "1"
settings.register_profile(
    "fast", max_examples=15, deadline=None, database=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "soak", max_examples=400, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("soak" if SOAK else "fast")


@pytest.fixture(scope="module")
async def fplane() -> AsyncIterator[FuzzPlane]:
    async with fuzz_plane() as plane:
        yield plane
