"""JavaScript string semantics the file tools reproduce: ICU `localeCompare` order and UTF-16 lengths.

Upstream runs on a JavaScript engine, so names sort by ICU root collation, plain `.sort()` compares
UTF-16 code units, and `.length`/`.substring` count UTF-16 code units rather than code points.
"""

from __future__ import annotations

import unicodedata

# ICU root order of whitespace, punctuation and symbols (all non-ignorable), as observed from ICU 78.
# Characters in one string share a primary weight and differ at secondary level, in that order.
_PUNCTUATION = [
    "\t", "\n", "\x0b", "\x0c", "\r", " \u3000\u00a0", "_", "-", "\u2010\u2011", "\u2012", "\u2013", "\u2014",
    "\u2015", ",\uff0c", "\u3001", ";", ":\uff1a", "!", "\u00a1", "?", "\u00bf", ".", "\u3002", "\u00b7",
    "'\u2018\u2019\u201a\u201b", "\u2039", "\u203a", '"\u201c\u201d\u201e\u201f', "\u00ab", "\u00bb", "(\uff08",
    ")\uff09", "[", "]", "{", "}", "\u300c", "\u300d", "\u00a7", "\u00b6", "@", "*", "/", "\\", "&", "#", "%",
    "\u2030", "\u2020", "\u2021", "\u2022", "\u2032", "\u2033", "`", "\u00b4", "^", "\u00af", "\u00a8", "\u00b8",
    "\u00b0", "\u00a9", "\u00ae", "+", "\u00b1", "\u00f7", "\u00d7", "<", "=", ">", "\u00ac", "|", "\u00a6", "~",
]
_CURRENCY = ["\u00a4", "\u00a2", "$", "\u00a3", "\u00a5", "\u20ac"]
_SYMBOL_WEIGHTS = {
    char: (group, rank) for group, chars in enumerate(_PUNCTUATION) for rank, char in enumerate(chars)
}
_CURRENCY_WEIGHTS = {char: (group, 0) for group, char in enumerate(_CURRENCY)}
# Letters ICU sorts as base letters with a secondary difference heavier than any accent.
_EXPANSIONS = {
    "ß": "ss", "ẞ": "ss", "æ": "ae", "Æ": "ae", "œ": "oe", "Œ": "oe", "ø": "o", "Ø": "o", "đ": "d", "Đ": "d",
    "ð": "d", "Ð": "d", "ł": "l", "Ł": "l", "ħ": "h", "Ħ": "h",
}
_VARIANT = {"ð": 2, "Ð": 2}  # sorts after đ
_HEAVY = 1000  # secondary weight of the expansion's difference
# Secondary (accent) order of the common combining marks in ICU root; others follow by code point.
_ACCENTS = [0x301, 0x300, 0x306, 0x302, 0x30C, 0x30A, 0x308, 0x30B, 0x303, 0x307, 0x327, 0x328, 0x304, 0x323]
_ACCENT_RANK = {mark: i for i, mark in enumerate(_ACCENTS)}

_OTHER_SYMBOL = 1000  # symbols missing from the table: after "~", by code point (an approximation)
_CURRENCY_BASE = 0x120000  # currency symbols come after every other symbol
_DIGIT = 0x240000
_LETTER = 0x240100
_OTHER_LETTER = 0x240200  # scripts after Latin, roughly in code point order (Greek, Cyrillic, ..., Han)

_COMMON = 0  # secondary/tertiary weight of a plain lowercase base character
_UPPER = 3
_VARIANT_FORM = 5

CollationKey = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def locale_key(text: str) -> CollationKey:
    """A sort key ordering strings like ICU root collation at tertiary strength (JS `localeCompare`).

    Exact for ASCII and for Latin letters with the usual accents; other scripts and symbols follow
    an approximation of the UCA order (by code point within their group).
    """
    primary: list[int] = []
    secondary: list[int] = []
    tertiary: list[int] = []
    for char in unicodedata.normalize("NFD", text):
        if char in _EXPANSIONS:
            base = _EXPANSIONS[char]
            case = _UPPER if char.isupper() else _COMMON
            primary.append(_LETTER + 2 * (ord(base[0]) - ord("a")))
            secondary.extend((_COMMON, _HEAVY + _VARIANT.get(char, 0)))
            tertiary.append(case)
            for letter in base[1:]:
                primary.append(_LETTER + 2 * (ord(letter) - ord("a")))
                secondary.append(_COMMON)
                tertiary.append(case)
            continue
        if unicodedata.combining(char):
            secondary.append(10 + _ACCENT_RANK.get(ord(char), len(_ACCENTS) + ord(char)))
            continue
        compat = unicodedata.normalize("NFKD", char) if not char.isascii() else char
        # Ligatures and compatibility forms (ĳ, ﬁ, ª, …) sort as what they stand for, after it at tertiary level.
        variant = _VARIANT_FORM if compat != char and all(_is_plain(part) for part in compat) else 0
        for part in compat if variant else char:
            weights = _weights(part)
            if weights is None:
                continue
            primary.append(weights[0])
            secondary.append(weights[1])
            tertiary.append((_UPPER if part.isupper() else _COMMON) + variant)
    return tuple(primary), tuple(secondary), tuple(tertiary)


def _is_plain(char: str) -> bool:
    return (char.isascii() and char.isalnum()) or char in _SYMBOL_WEIGHTS


def _weights(char: str) -> tuple[int, int] | None:
    """(primary, secondary) of one character that is not a combining mark; None if ignorable."""
    if char in _SYMBOL_WEIGHTS:
        return _SYMBOL_WEIGHTS[char]
    if char in _CURRENCY_WEIGHTS:
        group, rank = _CURRENCY_WEIGHTS[char]
        return _CURRENCY_BASE + group, rank
    if char.isascii() and char.isalpha():
        return _LETTER + 2 * (ord(char.lower()) - ord("a")), _COMMON
    if char == "\u0131":  # dotless i is its own letter right after i
        return _LETTER + 2 * (ord("i") - ord("a")) + 1, _COMMON
    category = unicodedata.category(char)
    if category == "Nd":
        return _DIGIT + unicodedata.decimal(char), _COMMON
    if category[0] in "LMN":
        return _OTHER_LETTER + ord(char.lower()[0]), _COMMON
    if category == "Sc":
        return _CURRENCY_BASE + len(_CURRENCY) + ord(char), _COMMON
    if category[0] in "PSZ":
        return _OTHER_SYMBOL + ord(char), _COMMON
    return None  # controls and format characters are ignorable


def code_unit_key(text: str) -> bytes:
    """Orders like JavaScript's default `.sort()`: by UTF-16 code units."""
    return text.encode("utf-16-be", "surrogatepass")


def utf16_length(text: str) -> int:
    """JavaScript's `text.length`."""
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def utf16_prefix(text: str, units: int) -> str:
    """JavaScript's `text.substring(0, units)`; a surrogate pair cut in half becomes U+FFFD."""
    if len(text) <= units // 2 or utf16_length(text) <= units:
        return text
    count = 0
    for index, char in enumerate(text):
        width = 2 if ord(char) > 0xFFFF else 1
        if count + width > units:
            return text[:index] + ("\ufffd" if count < units else "")
        count += width
    return text
