"""Doom-loop detection compares two calls' arguments by the text JavaScript's JSON.stringify gives them."""

from __future__ import annotations

import pytest

from controlplane.core.calls.doom_loop import DoomLoopDetector


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"b": 1, "1": 2}, {"1": 2, "b": 1}),  # JavaScript objects put index keys first
        ({"n": 1}, {"n": 1.0}),  # JSON.parse gives the same number
        ({"n": 100}, {"n": 1e2}),
        ({"n": 0}, {"n": -0.0}),
    ],
)
def test_doom_loop_compares_arguments_as_javascript_does(first: object, second: object) -> None:
    detector = DoomLoopDetector()
    assert detector.observe("s", "m", "bash", first) is False
    assert detector.observe("s", "m", "bash", second) is False
    assert detector.observe("s", "m", "bash", first) is True


def test_doom_loop_still_tells_different_arguments_apart() -> None:
    detector = DoomLoopDetector()
    calls = [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1, "b": 2}]  # key order matters to JSON.stringify
    assert [detector.observe("s", "m", "bash", c) for c in calls] == [False, False, False]
    assert [detector.observe("s", "m", "bash", {"a": 1, "b": 2}) for _ in range(2)] == [False, True]
    assert detector.observe("s", "m", "read", {"a": 1, "b": 2}) is False
    assert detector.observe("s", "other", "bash", {"a": 1, "b": 2}) is False
