"""The edit tool's replacers: which one matches what, uniqueness, replaceAll and the two failure messages."""

from __future__ import annotations

import pytest

from sandbox_agent.tools import replacers as r
from sandbox_agent.tools.base import ToolError
from sandbox_agent.tools.edit import apply_edit

NOT_FOUND = ("Could not find oldString in the file. It must match exactly, including whitespace, indentation, "
             "and line endings.")
MULTIPLE = "Found multiple matches for oldString. Provide more surrounding context to make the match unique."


def winner(content: str, find: str) -> str | None:
    """The name of the first replacer whose candidate is found exactly once, as `replace` picks it."""
    for replacer in r.REPLACERS:
        for candidate in replacer(content, find):
            index = content.find(candidate)
            if index != -1 and index == content.rfind(candidate):
                return replacer.__name__
    return None


def test_order_is_upstreams() -> None:
    assert [f.__name__ for f in r.REPLACERS] == [
        "simple", "line_trimmed", "block_anchor", "whitespace_normalized", "indentation_flexible",
        "escape_normalized", "trimmed_boundary", "context_aware", "multi_occurrence"]


def test_simple_exact() -> None:
    assert winner("a foo b", "foo") == "simple"
    assert r.replace("a foo b", "foo", "bar") == "a bar b"


def test_line_trimmed_matches_other_indentation_and_keeps_new_text_verbatim() -> None:
    content = "def f():\n    x = 1\n    y = 2\n    return x\n"
    assert winner(content, "x = 1\ny = 2\n") == "line_trimmed"
    assert list(r.line_trimmed(content, "x = 1\ny = 2\n")) == ["    x = 1\n    y = 2"]
    # The replacement is inserted as given: the file's indentation is not re-applied.
    assert r.replace(content, "x = 1\ny = 2\n", "z = 3") == "def f():\nz = 3\n    return x\n"


def test_block_anchor_matches_similar_middle() -> None:
    content = "def f():\n    a = 1\n    return a\nprint(f())\n"
    find = "def f():\n    a = 2\n    return a"
    assert winner(content, find) == "block_anchor"
    assert r.replace(content, find, "def f():\n    return 2") == "def f():\n    return 2\nprint(f())\n"


def test_block_anchor_picks_most_similar_of_several_candidates() -> None:
    content = "start\nalpha beta\nend\nstart\nalpha betx\nend\n"
    # Neither block is an exact or trimmed match; the second middle line is closer to the find.
    assert list(r.block_anchor(content, "start\nalpha bety\nend")) == ["start\nalpha beta\nend"]
    assert list(r.block_anchor(content, "start\nalpha bexx\nend")) == ["start\nalpha betx\nend"]


def test_block_anchor_single_candidate_needs_similarity() -> None:
    # Upstream accepts a lone candidate whatever its middle (threshold 0.0, issue #24959); the platform needs 0.3.
    content = "function a() {\n  totally\n  unrelated\n  code\n}\n"
    find = "function a() {\n  return 1\n}"
    assert list(r.block_anchor(content, find)) == []
    with pytest.raises(ToolError) as err:
        r.replace(content, find, "function a() {}")
    assert str(err.value) == NOT_FOUND


def test_block_anchor_single_candidate_threshold_boundary() -> None:
    # Middle similarity (1 - 7/10) = 0.3 exactly is accepted; one more differing character is not.
    content = "head\nabcdefghij\ntail\n"
    assert list(r.block_anchor(content, "head\nabcXXXXXXX\ntail")) == ["head\nabcdefghij\ntail"]
    assert list(r.block_anchor(content, "head\nabXXXXXXXX\ntail")) == []


def test_block_anchor_needs_three_lines_and_a_gap() -> None:
    assert list(r.block_anchor("a\nb\n", "a\nb")) == []
    # Only a last anchor at least two lines below the first counts.
    assert list(r.block_anchor("a\nc\nx\nc\n", "a\nc\nc")) == ["a\nc\nx\nc"]


def test_whitespace_normalized_whole_line() -> None:
    content = "x  =   1;\ny = 2;\n"
    assert winner(content, "x = 1;") == "whitespace_normalized"
    assert r.replace(content, "x = 1;", "x = 3;") == "x = 3;\ny = 2;\n"


def test_whitespace_normalized_inside_a_line() -> None:
    content = "if (a  &&\tb) {\n"
    assert winner(content, "a && b") == "whitespace_normalized"
    assert r.replace(content, "a && b", "c") == "if (c) {\n"


def test_whitespace_normalized_multiline_window() -> None:
    content = "call(a,\n     b)\n"
    assert list(r.whitespace_normalized(content, "call(a, \nb)")) == ["call(a,\n     b)"]


def test_indentation_flexible() -> None:
    # Everything it finds, LineTrimmed or WhitespaceNormalized finds first; checked on its own.
    content = "class A:\n        def f(self):\n            pass\n"
    assert list(r.indentation_flexible(content, "def f(self):\n    pass")) == [
        "        def f(self):\n            pass"]
    assert list(r.indentation_flexible(content, "def f(self):\npass")) == []


def test_escape_normalized() -> None:
    content = 'print("a\nb")\n'
    find = 'print(\\"a\\nb\\")'
    assert winner(content, find) == "escape_normalized"
    assert r.replace(content, find, "print(1)") == "print(1)\n"
    assert list(r.escape_normalized("x\\ty", "x\\ty")) == ["x\\ty"]  # window whose unescaped form matches


def test_trimmed_boundary() -> None:
    content = "xa\nbx\n"
    find = "\n  a\nb  \n"
    assert winner(content, find) == "trimmed_boundary"
    assert r.replace(content, find, "Q") == "xQx\n"
    assert list(r.trimmed_boundary(content, "a")) == []  # already trimmed: not tried


def test_context_aware() -> None:
    # Middle lines: one equal, one different, three blank. BlockAnchor averages over all five (0.2 < 0.3),
    # ContextAware ignores the blank ones (1 of 2 equal = 50%).
    content = "begin\nsame\n\n\n\nfoo\nend\n"
    find = "begin\nsame\n\n\n\nbar\nend"
    assert list(r.block_anchor(content, find)) == []
    assert winner(content, find) == "context_aware"
    assert r.replace(content, find, "X") == "X\n"


def test_context_aware_needs_same_line_count() -> None:
    assert list(r.context_aware("begin\nsame\nextra\nend\n", "begin\nsame\nend")) == []


def test_multi_occurrence_yields_each_occurrence() -> None:
    assert list(r.multi_occurrence("ab ab ab", "ab")) == ["ab", "ab", "ab"]
    assert list(r.multi_occurrence("aaaa", "aa")) == ["aa", "aa"]
    assert list(r.multi_occurrence("abc", "")) == []


def test_multiple_matches_message() -> None:
    with pytest.raises(ToolError) as err:
        r.replace("foo\nfoo\n", "foo", "bar")
    assert str(err.value) == MULTIPLE


def test_not_found_message() -> None:
    with pytest.raises(ToolError) as err:
        r.replace("foo\n", "nothing like it", "bar")
    assert str(err.value) == NOT_FOUND


def test_ambiguous_exact_match_falls_through_to_a_unique_fuzzy_one() -> None:
    # "x = 1" occurs twice, but the trimmed two-line form only once.
    content = "x = 1\n  x = 1\n  y = 2\n"
    assert r.replace(content, "x = 1\ny = 2", "Z") == "x = 1\nZ\n"


def test_replace_all() -> None:
    assert r.replace("foo bar foo", "foo", "baz", True) == "baz bar baz"
    # Dollar signs are inserted verbatim.
    assert r.replace("a.b.c", ".", "$&$$", True) == "a$&$$b$&$$c"


def test_replace_all_uses_first_found_candidate() -> None:
    content = "    a = 1\n    b = 2\n"
    assert r.replace(content, "a = 1", "A", True) == "    A\n    b = 2\n"


def test_identical_strings() -> None:
    with pytest.raises(ToolError) as err:
        r.replace("abc", "a", "a")
    assert str(err.value) == "No changes to apply: oldString and newString are identical."


def test_levenshtein() -> None:
    assert r.levenshtein("", "abc") == 3
    assert r.levenshtein("kitten", "sitting") == 3
    assert r.levenshtein("same", "same") == 0


def test_crlf_file_gets_crlf_replacement() -> None:
    content = "one\r\ntwo\r\nthree\r\n"
    assert apply_edit(content, "one\ntwo", "uno\ndos", False) == "uno\r\ndos\r\nthree\r\n"
    # A CRLF oldString is matched too (normalised first).
    assert apply_edit(content, "two\r\nthree", "2\n3", False) == "one\r\n2\r\n3\r\n"


def test_lf_file_normalises_crlf_strings() -> None:
    assert apply_edit("one\ntwo\n", "one\r\ntwo", "1\r\n2", False) == "1\n2\n"


def test_mixed_endings_count_as_crlf() -> None:
    # One CRLF makes the whole file CRLF; LineTrimmed then matches across the lone LF and eats the "\r".
    content = "a\nb\r\nc\n"
    assert apply_edit(content, "a\nb", "x\ny", False) == "x\r\ny\nc\n"


def test_js_whitespace_for_trim() -> None:
    # JavaScript's trim() removes U+FEFF and not U+0085; Python's strip() does the opposite.
    assert winner("\ufeffvalue\n", "value\nX") is None
    assert list(r.line_trimmed("\ufeffvalue\n", "value")) == ["\ufeffvalue"]
    assert list(r.line_trimmed("\x85value\n", "value")) == []
