"""The permission wildcard and the doom-loop's argument text, checked against real Bun (JavaScript).

The oracle script states the reference's §5 wildcard algorithm in JavaScript and uses the engine's own
`JSON.parse`/`JSON.stringify`, so regex, UTF-16 and number semantics are JavaScript's, not ours.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from controlplane.core.calls.doom_loop import DoomLoopDetector
from controlplane.core.permissions.permission import js_stringify
from controlplane.core.permissions.wildcard import match

ROOT = Path(__file__).resolve().parents[2]

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


def find_bun() -> Path:
    found = [ROOT / "build/image/bun", *sorted(ROOT.glob("build/cache/bun-*/package/bin/bun"))]
    for path in found:
        if path.is_file():
            return path
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (run `make image`)")


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


@pytest.fixture(scope="module")
def oracle() -> dict[str, list[object]]:
    cases = {"match": [[t, p] for p in PATTERNS for t in TEXTS], "json": JSON_TEXTS}
    proc = subprocess.run(
        [str(find_bun()), "-e", ORACLE], input=json.dumps(cases), capture_output=True, text=True, timeout=60,
        check=True,
    )
    result: dict[str, list[object]] = json.loads(proc.stdout)
    return result


def test_wildcard_agrees_with_javascript_regex_semantics(oracle: dict[str, list[object]]) -> None:
    pairs = [(t, p) for p in PATTERNS for t in TEXTS]
    ours = [match(t, p) for t, p in pairs]
    wrong = [(t, p, js) for (t, p), mine, js in zip(pairs, ours, oracle["match"], strict=True) if mine != js]
    assert wrong == []
    assert sum(ours) > 100  # the table exercises matches as well as misses


def test_js_stringify_is_javascripts(oracle: dict[str, list[object]]) -> None:
    assert [js_stringify(json.loads(text)) for text in JSON_TEXTS] == oracle["json"]


def test_js_stringify_examples() -> None:
    assert js_stringify({"b": 1, "1": 2, "x": 1.0, "y": -0.0}) == '{"1":2,"b":1,"x":1,"y":0}'
    assert js_stringify([float("nan"), float("inf"), None, True]) == "[null,null,null,true]"


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
