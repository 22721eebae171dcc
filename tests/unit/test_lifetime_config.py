"""`[lifetime]`'s pause and retention keys: typed, unknown keys refused, a pause that could never come first too."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.config import load_settings
from controlplane.errors import ConfigError


def test_pause_and_retention_are_read(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=tmp_path, lifetime={"pause_after_idle_s": 60, "retain_s": 3600})
    assert (settings.lifetime.pause_after_idle_s, settings.lifetime.retain_s) == (60, 3600)
    assert load_settings(None, data_dir=tmp_path).lifetime.pause_after_idle_s == 0  # off unless asked


@pytest.mark.parametrize(("lifetime", "says"), [
    ({"pause_after_idle_s": 1800}, "must be below lifetime.idle_timeout_s"),
    ({"pause_after_idle": 60}, "pause_after_idle"),
    ({"retain_s": -1}, "retain_s"),
])
def test_bad_lifetimes_are_refused(tmp_path: Path, lifetime: dict[str, float], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_settings(None, data_dir=tmp_path, lifetime=lifetime)
