"""JavaScript's text for JSON values (`String(x)`, `Number(x)`, `JSON.stringify`), checked against real Bun.

Tables of known answers first, then a few thousand values run through Bun itself: integers about the safe range
and 10**21, doubles drawn from every exponent, and the edge values (-0, NaN, Infinity, the smallest subnormal).
"""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import pytest

from opencode_semantics.javascript import (
    UNDEFINED,
    js_keys,
    js_number,
    js_parsed,
    js_string,
    js_to_number,
    json_stringify,
)
from tests.unit.opencode_semantics.bun import run_js


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"), (-0.0, "0"), (1.0, "1"), (0.5, "0.5"), (-2.5, "-2.5"), (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (123456789012345680000.0, "123456789012345680000"), (1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (1e-6, "0.000001"),
        (0.1 + 0.2, "0.30000000000000004"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        (2**53 - 1, "9007199254740991"), (10**21, "1e+21"), (-(2**70), "-1.1805916207174113e+21"),
        (math.inf, "Infinity"), (-math.inf, "-Infinity"), (math.nan, "NaN"),
    ],
)
def test_js_number(value: float, text: str) -> None:
    assert js_number(value) == text


@pytest.mark.parametrize(
    ("value", "number"),
    [
        ("", 0), ("  \n", 0), (" 12 ", 12), ("0x1F", 31), ("0o17", 15), ("0B101", 5), ("1e3", 1000.0), (".5", 0.5),
        ("5.", 5.0), ("+3", 3.0), ("-0", -0.0), (None, 0), (True, 1), (False, 0), ([], 0), ([7], 7), ([[8]], 8),
        ([None], 0), ("Infinity", math.inf), ("-Infinity", -math.inf), ("\u00a012\ufeff", 12),
    ],
)
def test_js_to_number(value: Any, number: float) -> None:
    assert js_to_number(value) == number


@pytest.mark.parametrize(
    "value", ["abc", "0x", "-0x10", "1_000", "inf", "nan", "infinity", "1e", [1, 2], [True], {}, "12abc", "1 2"]
)
def test_js_to_number_nan(value: Any) -> None:
    assert math.isnan(js_to_number(value))


def test_json_stringify_indented_matches_javascript() -> None:
    value = {"a": [1, 2.5, 1e21, "é\n\"\u2028", None, True], "b": {}, "c": [], "\ud800": "\udfff"}
    assert json_stringify(value, indent=2) == (
        '{\n  "a": [\n    1,\n    2.5,\n    1e+21,\n    "é\\n\\"\u2028",\n    null,\n    true\n  ],\n'
        '  "b": {},\n  "c": [],\n  "\\ud800": "\\udfff"\n}'
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(5, "5"), (-5, "-5"), (5.0, "5"), (-1.5, "-1.5"), (0.1, "0.1"), (-0.0, "0"), (1e21, "1e+21"),
     (1.5e-7, "1.5e-7"), (1e-6, "0.000001"), (1e16, "10000000000000000"), (2**60, "1152921504606847000"),
     (1500.25, "1500.25"), (2**53 - 1, "9007199254740991"),
     (123456789012345678, "123456789012345680")],
)
def test_js_number_of_tool_arguments(value: float, text: str) -> None:
    assert js_number(value) == text


def test_js_number_of_a_bool_is_string_of_a_bool() -> None:
    """Python's True is an int; JavaScript's `String(true)` is "true", never "1" or "True"."""
    assert (js_number(True), js_number(False)) == ("true", "false")
    assert (js_string(True), js_string(UNDEFINED), js_string([1, None, "a", [2.0]]), js_string({})) == (
        "true", "undefined", "1,,a,2", "[object Object]"
    )


def test_js_parsed_reads_integers_as_json_parse_does() -> None:
    parsed = js_parsed({"a": [2**53 + 1, 10**400, -(10**400)], "b": 7, "c": True})
    assert parsed == {"a": [2.0**53, math.inf, -math.inf], "b": 7, "c": True}
    assert type(parsed["b"]) is int


def test_js_keys_lists_array_indexes_first() -> None:
    assert js_keys({"b": 1, "10": 2, "2": 3, "02": 4, "-1": 5}) == ["2", "10", "b", "02", "-1"]


# --- against Bun ---------------------------------------------------------------------------------

ORACLE = r"""
const input = JSON.parse(await Bun.stdin.text());
const special = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity, undefined: undefined };
const isSpecial = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && "special" in v;
const value = (v) => (isSpecial(v) ? special[v.special] : v);
process.stdout.write(JSON.stringify({
  string: input.string.map((v) => String(value(v))),
  number: input.number.map((v) => String(Number(value(v)))),
  json: input.json.map((v) => JSON.stringify(v, null, 2)),
}));
"""


def _special(name: str) -> dict[str, str]:
    return {"special": name}


def _doubles(count: int) -> list[float]:
    """Doubles from every exponent (random bit patterns, NaN and Infinity left out), and their integral parts."""
    rng = random.Random(23)
    found: list[float] = []
    while len(found) < count:
        (x,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        if math.isfinite(x):
            found += [x, float(math.trunc(x))] if abs(x) < 1e30 else [x]
    return found


def _integers() -> list[int]:
    edges = [0, 1, -1, 9, 10, 2**31, 2**32 - 1, 2**53 - 1, 2**53, 2**53 + 1, 2**60, 2**64, 10**20, 10**21 - 1,
             10**21, 10**21 + 1, 123456789012345678, 12345678901234567890, 2**1023, 2**1024 - 2**970]
    rng = random.Random(53)
    drawn = [rng.randrange(-(10**digits), 10**digits) for digits in range(1, 40) for _ in range(20)]
    return edges + [-e for e in edges] + drawn


NUMBERS: list[Any] = [
    -0.0, 0.1, 0.2, 0.1 + 0.2, 1e-6, 1e-7, 1.5e-7, 123e-20, 1e21, 1e20, 5e-324, 1.7976931348623157e308,
    2.0**-1074, 0.000001234, 100.0, 1e300, -1e-300, *_integers(), *_doubles(3000),
]
SPECIALS = [_special("NaN"), _special("Infinity"), _special("-Infinity")]
SPECIAL_VALUES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf, "undefined": UNDEFINED}
STRING_VALUES: list[Any] = [
    True, False, None, "", "a b", [], [1, 2.5, None, "x"], [[1, [2]], True], {}, {"a": 1}, _special("undefined"),
    *SPECIALS,
]
NUMBER_INPUTS: list[Any] = [
    "", "  \n", " 12 ", "0x1F", "0o17", "0B101", "1e3", ".5", "5.", "+3", "-0", "-0x10", "1_000", "inf", "Infinity",
    "-Infinity", "+Infinity", "infinity", "12abc", "1 2", "\u00a012\ufeff", "\u2028 7 \u3000", "0x", "1e", "1e400",
    "00012", "0.0000001", None, True, False, [], [7], [[8]], [None], [1, 2], {}, _special("undefined"),
    "123456789012345678901234567890", "9007199254740993",
]
JSON_VALUES: list[Any] = [
    {"a": [1, 2.5, 1e21, "é\n\"\u2028", None, True], "b": {}, "c": [], "10": {"2": 0.1, "1": [[]]}},
    [1e-7, -0.0, 12345678901234567890, {"x": {"y": {"z": [1, {"w": None}]}}}],
    "text", 3, None, [], {},
]


def _ours(value: Any) -> Any:
    if isinstance(value, dict) and "special" in value:
        return SPECIAL_VALUES[value["special"]]
    return value


@pytest.fixture(scope="module")
def oracle() -> dict[str, list[str]]:
    cases = {"string": NUMBERS + SPECIALS + STRING_VALUES, "number": NUMBER_INPUTS + NUMBERS, "json": JSON_VALUES}
    result: dict[str, list[str]] = run_js(ORACLE, cases)
    return result


def _wrong(ours: list[str], theirs: list[str], inputs: list[Any]) -> list[tuple[Any, str, str]]:
    return [(v, mine, js) for v, mine, js in zip(inputs, ours, theirs, strict=True) if mine != js]


def test_js_number_is_string_of_a_number(oracle: dict[str, list[str]]) -> None:
    inputs = NUMBERS + SPECIALS
    ours = [js_number(_ours(v)) for v in inputs]
    assert _wrong(ours, oracle["string"][: len(inputs)], inputs) == []
    assert len(set(ours)) > 2500  # the table is not one value many times


def test_js_string_is_string_of_a_value(oracle: dict[str, list[str]]) -> None:
    inputs = NUMBERS + SPECIALS + STRING_VALUES
    assert _wrong([js_string(_ours(v)) for v in inputs], oracle["string"], inputs) == []


def test_js_to_number_is_number_of_a_value(oracle: dict[str, list[str]]) -> None:
    inputs = NUMBER_INPUTS + NUMBERS
    assert _wrong([js_number(js_to_number(_ours(v))) for v in inputs], oracle["number"], inputs) == []


def test_json_stringify_indented_is_javascripts(oracle: dict[str, list[str]]) -> None:
    assert _wrong([json_stringify(v, indent=2) for v in JSON_VALUES], oracle["json"], JSON_VALUES) == []


def test_json_stringify_takes_the_fast_path_only_where_python_writes_javascripts_text() -> None:
    from opencode_semantics import javascript

    cases: list[Any] = [
        {"todos": [{"content": "écrire ✓", "status": "pending", "n": 3, "ok": True, "none": None}], "e": [], "o": {}},
        {"10": "a", "2": "b", "x": "c"},  # array-index keys first: not the fast path
        {"x": 1.0, "y": 1e21, "z": float("nan")},  # JavaScript's number notation
        {"big": 2**60},  # beyond the safe integers: a double
        ["lone \ud800 surrogate", {"k": "\udfff"}],
        ("tuple", 1),
    ]
    for value in cases:
        for indent in (None, 2):
            assert javascript.json_stringify(value, indent) == javascript._stringify(value, indent, 0), (value, indent)
    assert javascript._plain(cases[0])
    assert not any(javascript._plain(v) for v in cases[1:4])
