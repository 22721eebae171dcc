"""The patch format behind apply_patch (sandbox_agent/tools/patch.py): parsing, the seek passes and content
derivation, without the tool (that is test_apply_patch.py)."""

from __future__ import annotations

import pytest

from sandbox_agent.tools.patch import (
    AddFile,
    DeleteFile,
    PatchError,
    UpdateChunk,
    UpdateFile,
    derive_new_contents,
    parse_patch,
    seek_sequence,
)
from tests.unit.tools.patch_support import patch

# --- parsing ---------------------------------------------------------------------------------------------------

def test_parse_all_hunk_kinds() -> None:
    hunks = parse_patch(patch(
        "*** Add File: new.txt",
        "+one",
        "+two",
        "*** Delete File:  old.txt ",
        "*** Update File: src/a.py",
        "*** Move to: src/b.py",
        "@@ def f():",
        " keep",
        "-gone",
        "+added",
        "",
        "@@",
        "-x",
        "+y",
    ))
    assert hunks == [
        AddFile("new.txt", "one\ntwo"),
        DeleteFile("old.txt"),
        UpdateFile("src/a.py", "src/b.py", [
            UpdateChunk(["keep", "gone"], ["keep", "added"], "def f():"),
            UpdateChunk(["x"], ["y"], None),
        ]),
    ]


@pytest.mark.parametrize("wrapper", [
    "cat <<'EOF'\n{}\nEOF",
    'cat <<"EOF"\n{}\nEOF\n',
    "<<PATCH\n{}\nPATCH",
    "  cat   <<EOF  \n{}\nEOF  ",
])
def test_heredoc_wrapper_is_stripped(wrapper: str) -> None:
    text = wrapper.format(patch("*** Delete File: a.txt"))
    assert parse_patch(text) == [DeleteFile("a.txt")]


def test_heredoc_with_mismatched_terminator_is_not_stripped_but_markers_still_found() -> None:
    # The wrapper stays, yet the markers are located anywhere in the text.
    text = "cat <<'EOF'\n" + patch("*** Delete File: a.txt") + "\nEND"
    assert parse_patch(text) == [DeleteFile("a.txt")]


@pytest.mark.parametrize("text", [
    "*** Add File: a.txt\n+x\n*** End Patch",
    "*** Begin Patch\n*** Add File: a.txt\n+x",
    "*** End Patch\n*** Begin Patch\n*** Add File: a.txt\n+x",
    "",
    "*** Begin Patch",
])
def test_missing_or_misordered_markers(text: str) -> None:
    with pytest.raises(PatchError) as info:
        parse_patch(text)
    assert str(info.value) == "Invalid patch format: missing Begin/End markers"


def test_markers_may_carry_surrounding_whitespace() -> None:
    text = "  *** Begin Patch  \n*** Delete File: a.txt\n\t*** End Patch\t"
    assert parse_patch(text) == [DeleteFile("a.txt")]


def test_unknown_headers_and_stray_lines_are_skipped() -> None:
    hunks = parse_patch(patch(
        "*** Frobnicate File: x",
        "garbage",
        "*** Add File:",
        "+ignored: an Add without a path is not a hunk",
        "*** Delete File: d.txt",
    ))
    assert hunks == [DeleteFile("d.txt")]


def test_add_takes_only_plus_lines() -> None:
    hunks = parse_patch(patch("*** Add File: a.txt", "+first", "context?", "-minus", "", "+", "+last"))
    assert hunks == [AddFile("a.txt", "first\n\nlast")]


def test_add_body_runs_past_an_indented_end_marker() -> None:
    # Like upstream, the body stops at a line starting with `***`, not at the (trimmed) End marker.
    hunks = parse_patch("*** Begin Patch\n*** Add File: a.txt\n+x\n  *** End Patch\n+after")
    assert hunks == [AddFile("a.txt", "x\nafter")]


def test_update_without_chunk_marker_has_no_chunks() -> None:
    hunks = parse_patch(patch("*** Update File: a.txt", "-old", "+new"))
    assert hunks == [UpdateFile("a.txt", None, [])]


def test_update_empty_line_in_body_is_ignored_and_empty_move_is_no_move() -> None:
    hunks = parse_patch(patch("*** Update File: a.txt", "*** Move to:   ", "@@", " a", "", "+b"))
    assert hunks == [UpdateFile("a.txt", None, [UpdateChunk(["a"], ["a", "b"])])]


def test_end_of_file_marker_is_recorded_and_later_chunks_still_parsed() -> None:
    hunks = parse_patch(patch("*** Update File: a.txt", "@@", "-x", "+y", "*** End of File", "@@ ctx", "+z"))
    assert hunks == [UpdateFile("a.txt", None, [
        UpdateChunk(["x"], ["y"], None, is_end_of_file=True),
        UpdateChunk([], ["z"], "ctx"),
    ])]


# --- seek_sequence -------------------------------------------------------------------------------------------

def test_seek_exact_rstrip_trim_and_punctuation_passes() -> None:
    lines = ["alpha  ", "   beta", "say \u201chi\u201d \u2014 ok\u2026", "x\u00a0y", "end"]
    assert seek_sequence(lines, ["end"], 0) == 4
    assert seek_sequence(lines, ["alpha"], 0) == 0  # rstrip
    assert seek_sequence(lines, ["beta  "], 0) == 1  # trim
    assert seek_sequence(lines, ['say "hi" - ok...'], 0) == 2  # punctuation
    assert seek_sequence(lines, ["x y"], 0) == 3  # NBSP
    assert seek_sequence(lines, ["alpha", "beta", 'say "hi" - ok...'], 0) == 0
    assert seek_sequence(lines, ["nothing"], 0) is None


def test_seek_prefers_a_stricter_pass_over_an_earlier_loose_match() -> None:
    assert seek_sequence(["foo ", "foo"], ["foo"], 0) == 1
    assert seek_sequence([" foo", "foo "], ["foo"], 0) == 1


def test_seek_respects_start_and_empty_pattern() -> None:
    lines = ["a", "b", "a"]
    assert seek_sequence(lines, ["a"], 1) == 2
    assert seek_sequence(lines, ["a"], 3) is None
    assert seek_sequence(lines, [], 0) is None
    assert seek_sequence(lines, ["a", "b", "a", "b"], 0) is None


def test_seek_at_end_of_file_only_tries_the_last_lines() -> None:
    lines = ["x", "y", "x"]
    assert seek_sequence(lines, ["x"], 0, eof=True) == 2
    assert seek_sequence(lines, ["y"], 0, eof=True) is None
    assert seek_sequence(lines, ["x "], 0, eof=True) == 2
    assert seek_sequence(lines, ["x", "y", "x"], 1, eof=True) is None


# --- derive_new_contents ---------------------------------------------------------------------------------------

def test_derive_replaces_in_order_and_keeps_trailing_newline() -> None:
    chunks = [UpdateChunk(["b"], ["B"]), UpdateChunk(["d"], ["D1", "D2"])]
    assert derive_new_contents("/f", chunks, "a\nb\nc\nd\n") == "a\nB\nc\nD1\nD2\n"
    assert derive_new_contents("/f", chunks, "a\nb\nc\nd") == "a\nB\nc\nD1\nD2\n"


def test_derive_chunks_are_sought_after_the_previous_one() -> None:
    chunks = [UpdateChunk(["x"], ["1"]), UpdateChunk(["x"], ["2"])]
    assert derive_new_contents("/f", chunks, "x\ny\nx\n") == "1\ny\n2\n"
    with pytest.raises(PatchError) as info:
        derive_new_contents("/f", chunks, "x\ny\n")
    assert str(info.value) == "Failed to find expected lines in /f:\nx"


def test_derive_context_moves_the_search_start() -> None:
    chunks = [UpdateChunk(["v = 1"], ["v = 2"], "def g():")]
    text = "def f():\n    v = 1\ndef g():\n    v = 1\n"
    assert derive_new_contents("/f", chunks, text) == "def f():\n    v = 1\ndef g():\nv = 2\n"


def test_derive_errors_name_the_context_and_every_old_line() -> None:
    with pytest.raises(PatchError) as info:
        derive_new_contents("/p/a.txt", [UpdateChunk(["a"], [], "class Nope")], "a\n")
    assert str(info.value) == "Failed to find context 'class Nope' in /p/a.txt"
    with pytest.raises(PatchError) as info:
        derive_new_contents("/p/a.txt", [UpdateChunk(["a", "zzz", "b"], ["c"])], "a\nb\n")
    assert str(info.value) == "Failed to find expected lines in /p/a.txt:\na\nzzz\nb"


def test_derive_retries_without_a_trailing_empty_old_line() -> None:
    chunks = [UpdateChunk(["b", ""], ["B", ""])]
    assert derive_new_contents("/f", chunks, "a\nb\n") == "a\nB\n"


def test_derive_no_chunks_only_ensures_a_trailing_newline() -> None:
    assert derive_new_contents("/f", [], "a") == "a\n"
    assert derive_new_contents("/f", [], "") == ""  # no lines at all: joining [""] gives ""
    assert derive_new_contents("/f", [], "a\n") == "a\n"


def test_pure_addition_without_context_appends() -> None:
    assert derive_new_contents("/f", [UpdateChunk([], ["z"])], "a\nb\n") == "a\nb\nz\n"
    # Upstream's quirk: a final blank line stays below the appended lines.
    assert derive_new_contents("/f", [UpdateChunk([], ["z"])], "a\n\n") == "a\nz\n"


def test_pure_addition_is_inserted_after_its_context_line() -> None:
    # Platform decision: upstream v1.2.27 would append "import os" at the end of the file.
    text = "import sys\n\ndef main():\n    pass\n"
    chunks = [UpdateChunk([], ["import os"], "import sys")]
    assert derive_new_contents("/f", chunks, text) == "import sys\nimport os\n\ndef main():\n    pass\n"


def test_pure_addition_at_context_then_a_replacement_right_below() -> None:
    chunks = [UpdateChunk([], ["new"], "a"), UpdateChunk(["b"], ["B"])]
    assert derive_new_contents("/f", chunks, "a\nb\nc\n") == "a\nnew\nB\nc\n"


def test_end_of_file_chunk_must_match_at_the_end() -> None:
    text = "}\nmiddle\n}\n"
    assert derive_new_contents("/f", [UpdateChunk(["}"], ["};"], None, True)], text) == "}\nmiddle\n};\n"
    assert derive_new_contents("/f", [UpdateChunk(["}"], ["};"])], text) == "};\nmiddle\n}\n"
    with pytest.raises(PatchError) as info:
        derive_new_contents("/f", [UpdateChunk(["middle"], ["m"], None, True)], text)
    assert str(info.value) == "Failed to find expected lines in /f:\nmiddle"


def test_end_of_file_pure_addition_appends_even_with_context() -> None:
    chunks = [UpdateChunk([], ["tail"], "a", True)]
    assert derive_new_contents("/f", chunks, "a\nb\n") == "a\nb\ntail\n"
