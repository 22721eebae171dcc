"""A loopback HTTP server with fixed pages for the webfetch oracle cases: `python3 server.py PORT`.

It binds, then forks into the background (so a case's setup returns once it listens) and exits by itself
after a few idle seconds. It is copied into each webfetch case's workspace as `server.py`.
"""

import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

PAGE = """<!DOCTYPE html>
<html><head><title>Sample page</title><meta charset="utf-8"><link rel="stylesheet" href="s.css">
<style>body { color: red; }</style><script>var x = 1;</script></head>
<body><h1>Main title</h1>
<p>Some <strong>bold</strong> and <em>italic</em> text with a <a href="https://example.com/x">link</a>.</p>
<h2>Lists</h2>
<ul><li>first</li><li>second</li></ul>
<ol><li>one</li><li>two</li></ol>
<h3>Code</h3>
<p>Inline <code>x = 1</code> here.</p>
<pre><code class="language-python">def f():
    return 1
</code></pre>
<blockquote><p>Quoted text</p></blockquote>
<hr>
<p>Fish &amp; chips &lt;3 &copy; caf&eacute;</p>
<noscript>Enable JS</noscript>
</body></html>
"""

HTML = {
    "page": PAGE,
    "headings": "<h1>One</h1><h2>Two</h2><h3>Three</h3><h4>Four</h4><h5>Five</h5><h6>Six</h6><p>end</p>",
    "nested-lists": "<ul><li>a<ul><li>a1</li><li>a2</li></ul></li><li>b</li></ul>"
                    "<ol start=\"3\"><li>three</li><li>four</li></ol>",
    "table": "<table><thead><tr><th>A</th><th>B</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table>",
    "image": "<p><img src=\"/pic.png\" alt=\"A picture\" title=\"T\"> after</p>",
    "br": "<p>line one<br>line two<br/>line three</p>",
    "pre-plain": "<pre>  indented\n    more\n</pre>",
    "emphasis": "<p><b>b</b> <i>i</i> <strong><em>both</em></strong> <del>gone</del> a_b*c</p>",
    "escapes": "<p># not heading</p><p>1. not list</p><p>- not bullet</p><p>[brackets] and `ticks`</p>",
    "links": "<p><a href=\"/rel\">relative</a> <a href=\"https://e.com\" title=\"Tt\">titled</a> <a>bare</a></p>",
    "whitespace": "<div>\n  <p>  spaced   out  \n text </p>\n\n\n<div>block</div>  tail  </div>",
    "inline-code-backtick": "<p><code>a`b</code></p>",
    "text-quirks": "before<p>para &amp; more</p>after<script>js()</script>hidden<b>shown</b>"
                   "<iframe>frame</iframe>x<object>obj</object>y<embed>z<i>w</i>",
    "unicode": "<p>héllo wörld ✓ 日本語 😀</p>",
    "empty-body": "<html><head><title>t</title></head><body></body></html>",
    "definition": "<dl><dt>term</dt><dd>meaning</dd></dl><p>x<sup>2</sup> H<sub>2</sub>O</p>",
    "head-only-title": "<html><head><title>Only title</title></head><body><p>body text</p></body></html>",
    "comment": "<p>a<!-- hidden --> b</p>",
    "div-spans": "<div><span>one</span><span>two</span></div><div>three</div>",
    "code-block-no-lang": "<pre><code>plain\ncode\n</code></pre>",
    "checkbox": "<ul><li><input type=\"checkbox\" checked> done</li><li><input type=\"checkbox\"> todo</li></ul>",
}

LINES = "".join(f"line {i}\n" for i in range(1, 3001))
WIDE = "".join(f"{i:05d} " + "x" * 94 + "\n" for i in range(600))  # 600 lines of 101 bytes: 60,600 bytes


def route(path: str, user_agent: str) -> tuple[int, list[tuple[str, str]], bytes | None]:
    """(status, headers, body) for a path; body None means: stream 6 MB (without a length unless one is given)."""
    if path.startswith("/html/"):
        return 200, [("Content-Type", "text/html; charset=utf-8")], HTML[path[6:]].encode()
    text = [("Content-Type", "text/plain; charset=utf-8")]
    if path == "/plain.txt":
        return 200, text, b"Hello, plain world.\nSecond line.\n"
    if path == "/data.json":
        return 200, [("Content-Type", "application/json")], b'{"a": 1, "b": [true, null]}'
    if path == "/page.md":
        return 200, [("Content-Type", "text/markdown")], b"# Title\n\n<b>kept</b> as is\n"
    if path == "/xhtml":
        return 200, [("Content-Type", "application/xhtml+xml")], b"<html><body><p>x</p></body></html>"
    if path == "/missing":
        return 404, text, b"not here"
    if path == "/error":
        return 500, text, b"boom"
    if path == "/created":
        return 201, text, b"created body"
    if path == "/nocontent":
        return 204, [], b""
    if path == "/image.png":
        return 200, [("Content-Type", "image/png")], bytes(range(256))
    if path == "/upper-image":
        return 200, [("Content-Type", "Image/PNG; foo=bar")], b"\x89PNG\r\n\x1a\n"
    if path == "/logo.svg":
        return 200, [("Content-Type", "image/svg+xml")], b'<svg xmlns="http://www.w3.org/2000/svg"><rect/></svg>'
    if path == "/redirect":
        return 302, [("Location", "/plain.txt")], b""
    if path == "/redirect-missing":
        return 301, [("Location", "/missing")], b""
    if path == "/empty":
        return 200, text, b""
    if path == "/no-type":
        return 200, [], b"untyped body"
    if path == "/latin1":
        return 200, [("Content-Type", "text/plain; charset=iso-8859-1")], b"caf\xe9 cr\xe8me"
    if path == "/bom":
        return 200, text, b"\xef\xbb\xbfwith bom\n"
    if path == "/crlf":
        return 200, text, b"a\r\nb\r\n"
    if path == "/lines":
        return 200, text, LINES.encode()
    if path == "/wide":
        return 200, text, WIDE.encode()
    if path == "/one-line":
        return 200, text, b"y" * 60000
    if path == "/big-declared":
        return 200, [*text, ("Content-Length", str(6 * 1024 * 1024))], None
    if path == "/big-stream":
        return 200, text, None
    if path == "/echo":
        body = f"ua: {user_agent}\naccept: {HEADERS.get('accept')}\naccept-language: {HEADERS.get('accept-language')}\n"
        return 200, text, body.encode()
    if path == "/challenge":
        if user_agent == "opencode":
            return 200, text, b"passed the challenge"
        return 403, [*text, ("cf-mitigated", "challenge")], b"challenge page"
    if path == "/challenge-always":
        return 403, [*text, ("cf-mitigated", "challenge")], b"challenge page"
    if path == "/forbidden":
        return 403, text, b"forbidden"
    if path == "/slow":
        time.sleep(4)
        return 200, text, b"late"
    return 404, text, b"unknown route"


HEADERS: dict[str, str] = {}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        HEADERS.clear()
        HEADERS.update({k.lower(): v for k, v in self.headers.items()})
        status, headers, body = route(self.path.split("?")[0], self.headers.get("User-Agent", ""))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        if body is not None and not any(k == "Content-Length" for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if body is None:
                chunk = b"z" * 65536
                for _ in range(6 * 16):
                    self.wfile.write(chunk)
            else:
                self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    child = os.fork()
    if child > 0:
        with open("server.pid", "w") as pid:  # so a replay can stop it at once
            pid.write(str(child))
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    server.timeout = 1
    deadline = time.monotonic() + float(sys.argv[2] if len(sys.argv) > 2 else 30)
    while time.monotonic() < deadline:
        server.handle_request()
    server.server_close()


if __name__ == "__main__":
    main()
