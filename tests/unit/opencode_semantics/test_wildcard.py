"""The permission wildcard and JSON.stringify's compact text, checked against real Bun (JavaScript).

The oracle script states the reference's §5 wildcard algorithm in JavaScript and uses the engine's own
`JSON.parse`/`JSON.stringify`, so regex, UTF-16 and number semantics are JavaScript's, not ours.
"""

from __future__ import annotations

import json
import random

import pytest

from opencode_semantics.javascript import json_stringify
from opencode_semantics.wildcard import match
from tests.unit.opencode_semantics.bun import run_js

ORACLE = r"""
const input = JSON.parse(await Bun.stdin.text());
function wildcard(str, pattern) {
  const text = str.replaceAll("\\", "/");
  let re = pattern.replaceAll("\\", "/").replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  if (re.endsWith(" .*")) re = re.slice(0, -3) + "( .*)?";
  return new RegExp("^" + re + "$", "s").test(text);
}
const out = {
  match: input.match.map(([t, p]) => wildcard(t, p)),
  json: input.json.map((text) => JSON.stringify(JSON.parse(text))),
};
process.stdout.write(JSON.stringify(out));
"""


PATTERNS = [
    "*", "**", "", "?", "??", "ls *", "ls*", "ls  *", " *", "*.env", "*.env.*", "*.env.example",
    "git log*", "git * --force", "a?c", "a.c", "a+c", "(a)", "[ab]", "{x}", "^a$", "a|b", "$HOME/x",
    "~/x", "/tmp/*", "/tmp/**", "C:\\Users\\*", "C:/Users/*", "src/**/*.ts", "*/", "dir/", "A*",
    "rm -rf *", "echo \"*\"", "a\\*", "é*", "😀?", "?😀", "x *y", "x * ", "%s", "a-b", "#*", "line\n*",
]
TEXTS = [
    "", "ls", "ls -la", "lstmeval", "ls  -a", "ls\t-la", "a.c", "abc", "a+c", "aac", "(a)", "a", "b",
    "[ab]", "{x}", "^a$", "a|b", ".env", "prod.env", "x.env.local", "x.env.example", "git log --oneline",
    "git log", "git push --force", "/tmp", "/tmp/", "/tmp/a/b", "C:\\Users\\me", "C:/Users/me", "src/a/b.ts",
    "dir/", "dir", "a/", "Abc", "abc", "rm -rf /", "echo \"*\"", "a\\b", "a/b", "a*", "éclair", "😀",
    "😀x", "x😀", "xy", "x y", "x  y", "x ", "x", "%s", "a-b", "#x", "line\nnext", "multi\nline *",
    "$HOME/x", "~/x", " ", " x",
]

JSON_TEXTS = [
    '{"b":1,"1":2,"a":3,"0":4}', '{"x":1.0}', '{"x":-0.0}', '{"x":1e2}', '{"x":1.5e-7}', '{"x":123456789012345678}',
    '{"x":1e21}', '{"x":0.1}', '{"x":[1.0,2.50,{"10":1,"9":2}]}', '{"s":"é\\u00e9\\ud800x","n":null,"t":true}',
    '{"01":1,"1":2,"-1":3,"4294967294":4,"4294967295":5}', '{"nested":{"2":{"b":1,"a":2},"1":[]}}',
]

MORE_PATTERNS = [
    "*", "?", "", "ls", "ls *", "ls*", "git *", "git push *", "*.env", "*.env.*", "*.env.example", "a?c", "a*c",
    "/tmp/*", "/tmp/home/.local/share/opencode/tool-output/*", "C:\\Users\\*", "a.b", "a+b", "(x)", "[ab]", "{a,b}",
    "^x$", "a|b", "x\\y", "$HOME", "~/x", "😀", "?😀", "😀?", "é*", "rm -rf *", "echo *", " *", "* ", "a\nb", "*\n",
]
MORE_TEXTS = [
    "", "ls", "ls ", "ls -la", "lstmeval", "git", "git push origin", "git  push", ".env", "a.env", "a.env.local",
    "a.env.example", "abc", "ac", "abbc", "a\nc", "/tmp/x", "/tmp/", "/tmp", "C:/Users/me", "C:\\Users\\me", "a.b",
    "axb", "a+b", "aab", "(x)", "x", "[ab]", "a", "{a,b}", "^x$", "a|b", "x/y", "x\\y", "$HOME", "~/x", "😀", "a😀",
    "😀a", "é", "éa", "rm -rf /", "echo hi", "echo", " ", "a\nb", "x\n", "\n",
]


def _random_pairs() -> list[tuple[str, str]]:
    """Texts and patterns over the characters that matter to the translation (regex specials, `\\`, astral)."""
    rng = random.Random(20261122)
    alphabet = "ab*? .\\/😀é\n$()[]{}+|^-"
    return [
        ("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))),
         "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))))
        for _ in range(5000)
    ]


PAIRS = [(t, p) for p in PATTERNS for t in TEXTS] + [
    (t, p) for p in MORE_PATTERNS for t in MORE_TEXTS + MORE_PATTERNS
] + _random_pairs()


@pytest.fixture(scope="module")
def oracle() -> dict[str, list[object]]:
    cases = {"match": [[t, p] for t, p in PAIRS], "json": JSON_TEXTS}
    result: dict[str, list[object]] = run_js(ORACLE, cases)
    return result


def test_wildcard_agrees_with_javascript_regex_semantics(oracle: dict[str, list[object]]) -> None:
    ours = [match(t, p) for t, p in PAIRS]
    wrong = [(t, p, js) for (t, p), mine, js in zip(PAIRS, ours, oracle["match"], strict=True) if mine != js]
    assert wrong == []
    assert sum(ours) > 100  # the table exercises matches as well as misses


def test_json_stringify_is_javascripts(oracle: dict[str, list[object]]) -> None:
    assert [json_stringify(json.loads(text)) for text in JSON_TEXTS] == oracle["json"]


def test_json_stringify_examples() -> None:
    assert json_stringify({"b": 1, "1": 2, "x": 1.0, "y": -0.0}) == '{"1":2,"b":1,"x":1,"y":0}'
    assert json_stringify([float("nan"), float("inf"), None, True]) == "[null,null,null,true]"
