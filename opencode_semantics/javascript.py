"""JavaScript's view of JSON values: the text upstream prints for them, the numbers it reads, its key order.

Upstream is JavaScript, so every number it echoes is a double printed by `Number.prototype.toString`, every
object lists its array-index keys first, and `JSON.parse` has already turned a large integer into the nearest
double. Messages a model reads (a validation error, a tool's timeout, a permission rule) must print values as
upstream does, on both sides of the trust boundary: these functions are the one place that knows how.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

MAX_SAFE_INTEGER = 2**53 - 1
"""`Number.MAX_SAFE_INTEGER`: past it, not every integer has a double of its own."""

JS_WHITESPACE = "\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff" + "".join(
    chr(c) for c in range(0x2000, 0x200B)
)
"""What `String.prototype.trim` removes and a regex `\\s` matches (WhiteSpace and LineTerminator); Python's
`str.strip()` differs a little."""


class Undefined(enum.Enum):
    """JavaScript's `undefined`: a key absent from the arguments, which is not `null`."""

    UNDEFINED = enum.auto()


UNDEFINED = Undefined.UNDEFINED


def is_number(value: object) -> bool:
    """A JavaScript number: Python's bool is an int, but `true` is not a number."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def js_number(value: float) -> str:
    """`String(value)` for a number: shortest round-trip digits in JavaScript's notation (5 not 5.0, 1e+21,
    1.5e-7, -0 as 0). An integer is the double JavaScript would hold for it, so 2**60 prints as
    1152921504606847000. A bool prints as `String(true)` does: Python's True is an int, JavaScript's is not."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) <= MAX_SAFE_INTEGER:
            return str(value)
        value = _double(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits, n = _shortest_digits(abs(value))
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exponent = f"e{'+' if e >= 0 else '-'}{abs(e)}"
    return sign + (digits if k == 1 else digits[0] + "." + digits[1:]) + exponent


def _double(value: int) -> float:
    try:
        return float(value)
    except OverflowError:  # past the largest double: JavaScript reads Infinity
        return math.inf if value > 0 else -math.inf


def _shortest_digits(x: float) -> tuple[str, int]:
    """Digits (no leading/trailing zeros) and n such that x = 0.d1d2... * 10**n."""
    text = repr(x)
    mantissa, _, exp_part = text.partition("e")
    exp = int(exp_part) if exp_part else 0
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    lead_zeros = len(whole + frac) - len((whole + frac).lstrip("0"))
    n = len(whole) - lead_zeros + exp
    return digits.rstrip("0") or "0", n


def js_string(value: Any) -> str:
    """`String(v)` for JSON values (arrays join their items with commas, null items as empty)."""
    if value is UNDEFINED:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if is_number(value):
        return js_number(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return ",".join("" if v is None or v is UNDEFINED else js_string(v) for v in value)
    return "[object Object]"


def js_parsed(value: Any) -> Any:
    """`value` as JavaScript's `JSON.parse` holds it: an integer beyond the safe range becomes the nearest double.

    Upstream never sees 12345678901234567890, only 12345678901234567000: what it echoes (todowrite's output, a
    `read` offset in a message) and the bounds it checks are about that double, so ours must be too.
    """
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        return _double(value)
    if isinstance(value, list):
        return [js_parsed(v) for v in value]
    if isinstance(value, dict):
        return {k: js_parsed(v) for k, v in value.items()}
    return value


def js_keys(keys: Iterable[str]) -> list[str]:
    """`Object.keys` order of an object with these keys (a dict's, say): array-index keys ("0", "7", ...)
    ascending first, then the rest as inserted. Upstream parses config and arguments into JavaScript objects,
    so `{"*": .., "10": .., "2": ..}` iterates as 2, 10, *."""
    keys = list(keys)
    index = sorted((k for k in keys if _is_array_index(k)), key=int)
    return index + [k for k in keys if not _is_array_index(k)]


def _is_array_index(key: str) -> bool:
    return key.isascii() and key.isdigit() and (key == "0" or key[0] != "0") and int(key) < 2**32 - 1


_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_RADIX = {
    "0x": (16, re.compile(r"[0-9a-fA-F]+")),
    "0o": (8, re.compile(r"[0-7]+")),
    "0b": (2, re.compile(r"[01]+")),
}


def js_to_number(value: Any) -> float:
    """JavaScript's `Number(v)` for JSON values (what `z.coerce.number()` applies first)."""
    if value is UNDEFINED:
        return math.nan
    if value is None or value is False:
        return 0
    if value is True:
        return 1
    if is_number(value):
        return float(value) if isinstance(value, float) else value
    if isinstance(value, list | tuple):
        return _string_to_number(js_string(value))
    if isinstance(value, str):
        return _string_to_number(value)
    return math.nan


def _string_to_number(text: str) -> float:
    text = text.strip(JS_WHITESPACE)
    if not text:
        return 0
    prefix = text[:2].lower()
    if prefix in _RADIX:
        radix, pattern = _RADIX[prefix]
        return int(text[2:], radix) if pattern.fullmatch(text[2:]) else math.nan
    if text in ("Infinity", "+Infinity"):
        return math.inf
    if text == "-Infinity":
        return -math.inf
    if _DECIMAL.fullmatch(text):
        return float(text)
    return math.nan


def json_stringify(value: Any, indent: int | None = None) -> str:
    """`JSON.stringify(value, null, indent)` for JSON data: keys in `Object.keys` order, numbers in
    JavaScript's notation (NaN and Infinity as null), non-ASCII kept, lone surrogates escaped. Without
    `indent` the text is compact, as `JSON.stringify(value)` writes it."""
    if _plain(value):
        # Where JavaScript and Python write the same text, Python's encoder does it several times faster than
        # _stringify (a multi-MiB tool argument took seconds of the control plane's CPU).
        text = json.dumps(value, ensure_ascii=False, indent=indent, separators=(",", ":" if indent is None else ": "))
        if not _LONE_SURROGATE.search(text):
            return text
    return _stringify(value, indent, 0)


def _plain(value: Any) -> bool:
    """Whether `json.dumps` writes `value` as JavaScript does: only dicts with keys that are not array indexes
    (JavaScript puts those first), lists, strings, safe integers, booleans and null; no floats (their notation
    differs) and nothing else (a lone surrogate in a string is checked in the text)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is int:
            if -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                continue
            return False
        if kind is dict:
            for key in item:
                if type(key) is not str or (key[:1].isdigit() and _is_array_index(key)):
                    return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False
    return True


def _stringify(value: Any, indent: int | None, level: int) -> str:
    pad = "" if indent is None else "\n" + " " * (indent * (level + 1))
    end = "" if indent is None else "\n" + " " * (indent * level)
    colon = ":" if indent is None else ": "
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        keys = {str(k): k for k in value}
        items = [f"{pad}{js_quote(k)}{colon}{_stringify(value[keys[k]], indent, level + 1)}" for k in js_keys(keys)]
        return "{" + ",".join(items) + end + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        return "[" + ",".join(pad + _stringify(v, indent, level + 1) for v in value) + end + "]"
    if value is None or value is UNDEFINED:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if is_number(value):
        number = value if isinstance(value, float) or abs(value) <= MAX_SAFE_INTEGER else _double(value)
        return js_number(number) if math.isfinite(number) else "null"
    return js_quote(value if isinstance(value, str) else str(value))


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def js_quote(text: str) -> str:
    """A JSON string literal as JavaScript writes it: non-ASCII kept, lone surrogates escaped."""
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))
