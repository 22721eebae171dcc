"""Doom-loop detection compares two calls' arguments by the text JavaScript's JSON.stringify gives them, and
keeps a digest of that text, not the text: a tenant naming a new message for every large call holds no
memory by it."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from controlplane.core.calls.doom_loop import DoomLoopDetector, fingerprint
from opencode_semantics.javascript import json_stringify


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


def test_large_calls_of_many_messages_leave_only_digests_behind() -> None:
    doom = DoomLoopDetector()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for message in range(20):
            args = {"command": f"echo {message} " + "x" * (1 << 20)}
            assert not doom.observe("s", f"m{message}", "bash", args)  # each call a message of its own
            del args
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 256 * 1024, f"{kept} bytes kept for 20 calls of 1 MiB"


def test_a_run_is_still_found_from_digests_made_by_the_caller_or_here() -> None:
    doom = DoomLoopDetector()
    args = {"filePath": "/a", "big": "y" * 100_000}
    digest = fingerprint(json_stringify(args))
    assert not doom.observe("s", "m", "read", args)
    assert not doom.observe("s", "m", "read", args, digest)  # made off the loop, as for large arguments
    assert doom.observe("s", "m", "read", {"filePath": "/a", "big": "y" * 100_000})
    assert not doom.observe("s", "m", "read", {"filePath": "/b"})
