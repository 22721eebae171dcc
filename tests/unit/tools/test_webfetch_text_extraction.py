"""webfetch's `text` format checked against upstream's extraction, run for real in Bun's HTMLRewriter."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from controlplane.tools.webfetch import html_to_text

ROOT = Path(__file__).resolve().parents[3]

# The extraction upstream's webfetch performs for format "text", written out for the oracle (the same
# selectors and skip flag, driven by Bun's own HTMLRewriter).
ORACLE = """
const SKIP = ["script", "style", "noscript", "iframe", "object", "embed"]
const cases = JSON.parse(await Bun.stdin.text())
const out = []
for (const html of cases) {
  let text = ""
  let skip = false
  await new HTMLRewriter()
    .on(SKIP.join(", "), { element() { skip = true }, text() {} })
    .on("*", {
      element(el) { if (!SKIP.includes(el.tagName)) skip = false },
      text(chunk) { if (!skip) text += chunk.text },
    })
    .transform(new Response(html))
    .text()
  out.push(text.trim())
}
process.stdout.write(JSON.stringify(out))
"""

CASES = {
    "<p>a &amp; b &lt;c&gt; &#65; &copy x</p>": "a &amp; b &lt;c&gt; &#65; &copy x",
    "Hello <b>World</b> tail": "World",
    "<div>x</div>after the root": "x",
    "<p>a<script>s()</script>b<i>c</i></p>": "ac",
    "<p>a<embed src=x.swf> hidden<b>shown</b></p>": "ashown",
    "<p>a<img src=x>b<br/>c<hr>d</p>": "abcd",
    "<ul><li>a<li>b</ul>c": "ab",
    "<p/>x": "x",
    "<p><iframe><p>x</p></iframe>y<b>z</b></p>": "z",
    "<p><noscript><p>x</p></noscript>y<b>z</b></p>": "z",
    "<p>x<object><b>2</b></object>3</p>": "x23",
    "<p><title>a &amp; <b>c</b></title>q</p>": "a &amp; <b>c</b>q",
    "<p>x<textarea>1<b>2</b></textarea>3</p>": "x1<b>2</b>3",
    "<p>a<!-- c -->b<![CDATA[x]]>d</p>": "abd",
    "<P>Up<SCRIPT>if (a<b) {}</SCRIPT>x<B>y</B></P>": "Upy",
    "<p>x</span>y</p>": "xy",
    "<p>a<textarea>x &amp; <b>y": "ax &amp; <b>y",
    "<p>a<script>x</p>": "a",
    "<p>a<b": "a",
    "<p>a<!-- b": "a",
    "<p>a < b</p>": "a < b",
    "<p>a<title/>b<textarea/>c<b>d</b></p>": "ab<textarea/>c<b>d</b></p>",
    "<p>é ✓ 😀 &#x1F600;</p>": "é ✓ 😀 &#x1F600;",
    "<!DOCTYPE html>\n<html><head><style>a{}</style></head>\n<body> <p>one</p>\n<p>two</p> </body></html>\n":
        "one\ntwo",
    "<table><tr><td>1</td><td>2</td></tr></table>": "12",
    "<p>\u00a0 spaced \u3000</p>": "spaced",
    "": "",
}


@pytest.mark.parametrize(("html", "text"), list(CASES.items()))
def test_text_extraction(html: str, text: str) -> None:
    assert html_to_text(html) == text


def find_bun() -> Path:
    found = [ROOT / "build/image/bun", *sorted(ROOT.glob("build/cache/bun-*/package/bin/bun"))]
    for path in found:
        if path.is_file():
            return path
    pytest.fail("no Bun binary: expected build/image/bun or build/cache/bun-*/package/bin/bun (run `make image`)")


def test_expectations_are_what_bun_htmlrewriter_gives(tmp_path: Path) -> None:
    script = tmp_path / "oracle.ts"
    script.write_text(ORACLE)
    done = subprocess.run([str(find_bun()), "run", str(script)], input=json.dumps(list(CASES)), capture_output=True,
                          text=True, timeout=60, check=True)
    assert dict(zip(CASES, json.loads(done.stdout), strict=True)) == CASES
