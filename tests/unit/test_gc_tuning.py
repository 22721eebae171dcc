"""The server processes' collector settings: start-up objects frozen, a larger young generation."""

from __future__ import annotations

import gc

from sandbox_agent.gc_tuning import GEN0_THRESHOLD, tune_after_startup


def test_tuning_freezes_what_exists_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        tune_after_startup()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
