"""webfetch against real HTTP servers on loopback, allowed by the test's egress policy."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.core.calls.tool import Attachment, InitContext, PermissionAsk, ToolError, ToolResult
from controlplane.egress import BROWSER_USER_AGENT, EgressPolicy
from controlplane.tools import webfetch
from tests.unit.tools.web_support import (
    Guard,
    LoopbackServer,
    Recorder,
    RequestHandler,
    declared,
    redirect,
    slow,
    streamed,
    text,
    tool_context,
)

POLICY = EgressPolicy(allow_cidrs=("127.0.0.1/32",))
MB5 = 5 * 1024 * 1024

PAGE = """<!doctype html>
<html><head><title>Guide</title><meta charset="utf-8"><link rel="stylesheet" href="/s.css">
<style>body { color: red }</style><script>window.secret = "tracking";</script></head>
<body>
<h1>Getting started</h1>
<p>Install <strong>fast</strong> and <em>carefully</em>, see <a href="/docs">the docs</a>.</p>
<ul><li>first</li><li>second<ul><li>nested</li></ul></li></ul>
<pre><code class="language-python">def hello():
    return "hi"
</code></pre>
<hr>
<h2>Details</h2>
<noscript>Enable JavaScript</noscript><iframe src="/ad">ad frame</iframe>
<p>a &amp; b<embed src="/x.swf"> end</p>
<script>document.write("late")</script>
</body></html>"""

PAGE_MARKDOWN = """Guide\x20

# Getting started

Install **fast** and *carefully*, see [the docs](/docs).

-   first
-   second
    -   nested

```python
def hello():
    return "hi"
```

---

## Details

Enable JavaScriptad frame

a & b end"""

PAGE_TEXT = """Guide

Getting started
Install fast and carefully, see the docs.
firstsecondnested
def hello():
    return "hi"


Details
a &amp; b"""
"""As upstream's HTMLRewriter pass gives it: entities as written, nothing after `<embed>` until the next tag."""


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as srv:
        srv.routes["/page"] = text(PAGE, "text/html; charset=utf-8")
        yield srv


async def fetch(args: dict[str, Any], recorder: Recorder | None = None, policy: EgressPolicy = POLICY,
                abort: asyncio.Event | None = None) -> ToolResult:
    tool = webfetch.make_tool(policy)
    definition = await tool.init(InitContext(agent="build"))
    return await definition.execute(args, tool_context(recorder or Recorder(), abort))


async def failure(args: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ToolError) as info:
        await fetch(args, **kwargs)
    return str(info.value)


# --- conversions -------------------------------------------------------------------------------------


async def test_html_becomes_markdown(guard: Guard, server: LoopbackServer) -> None:
    # Only script, style, meta and link are dropped for markdown (as upstream); noscript and iframe text stays.
    result = await fetch({"url": server.url("/page"), "format": "markdown"})
    assert result.output == PAGE_MARKDOWN
    assert result.title == f"{server.url('/page')} (text/html; charset=utf-8)"
    assert result.metadata == {}
    assert result.attachments == []


async def test_html_becomes_text_without_hidden_elements(guard: Guard, server: LoopbackServer) -> None:
    result = await fetch({"url": server.url("/page"), "format": "text"})
    assert result.output == PAGE_TEXT
    for hidden in ("tracking", "late", "color: red", "ad frame"):
        assert hidden not in result.output


async def test_html_format_returns_the_page_as_received(guard: Guard, server: LoopbackServer) -> None:
    assert (await fetch({"url": server.url("/page"), "format": "html"})).output == PAGE


async def test_markdown_is_the_default_format(guard: Guard, server: LoopbackServer) -> None:
    assert (await fetch({"url": server.url("/page")})).output == PAGE_MARKDOWN


@pytest.mark.parametrize("fmt", ["markdown", "text", "html"])
async def test_other_content_types_come_back_raw(guard: Guard, server: LoopbackServer, fmt: str) -> None:
    server.routes["/data.json"] = text('{"<b>": "not html"}', "application/json")
    server.routes["/notes.md"] = text("# Title\n\n<p>kept</p>\n", "text/markdown")
    assert (await fetch({"url": server.url("/data.json"), "format": fmt})).output == '{"<b>": "not html"}'
    assert (await fetch({"url": server.url("/notes.md"), "format": fmt})).output == "# Title\n\n<p>kept</p>\n"


async def test_missing_content_type_and_undecodable_bytes(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/raw"] = text(b"\xef\xbb\xbfcaf\xc3\xa9 \xff!", None)
    result = await fetch({"url": server.url("/raw")})
    assert result.title == f"{server.url('/raw')} ()"
    assert result.output == "café \ufffd!"


async def test_accept_header_and_user_agent_follow_the_format(guard: Guard, server: LoopbackServer) -> None:
    for fmt in ("markdown", "text", "html"):
        await fetch({"url": server.url("/page"), "format": fmt})
    accepts = [s.headers["accept"] for s in server.seen]
    assert accepts == [
        "text/markdown;q=1.0, text/x-markdown;q=0.9, text/plain;q=0.8, text/html;q=0.7, */*;q=0.1",
        "text/plain;q=1.0, text/markdown;q=0.9, text/html;q=0.8, */*;q=0.1",
        "text/html;q=1.0, application/xhtml+xml;q=0.9, text/plain;q=0.8, text/markdown;q=0.7, */*;q=0.1",
    ]
    assert {s.headers["user-agent"] for s in server.seen} == {BROWSER_USER_AGENT}
    assert {s.headers["accept-language"] for s in server.seen} == {"en-US,en;q=0.9"}


async def test_operator_user_agent_is_used(guard: Guard, server: LoopbackServer) -> None:
    policy = EgressPolicy(allow_cidrs=("127.0.0.1/32",), user_agent="ocsb-fetch/1")
    await fetch({"url": server.url("/page")}, policy=policy)
    assert server.seen[0].headers["user-agent"] == "ocsb-fetch/1"


# --- images ------------------------------------------------------------------------------------------------

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


async def test_images_become_attachments(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/dot.png"] = text(PNG, "Image/PNG; name=dot")
    result = await fetch({"url": server.url("/dot.png"), "format": "text"})
    assert result.output == "Image fetched successfully"
    assert result.title == f"{server.url('/dot.png')} (Image/PNG; name=dot)"
    assert result.attachments == [
        Attachment(mime="image/png", url="data:image/png;base64," + base64.b64encode(PNG).decode())
    ]
    assert result.metadata == {}


async def test_svg_is_returned_as_text(guard: Guard, server: LoopbackServer) -> None:
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><circle r="1"/></svg>'
    server.routes["/logo.svg"] = text(svg, "image/svg+xml")
    result = await fetch({"url": server.url("/logo.svg")})
    assert (result.output, result.attachments) == (svg, [])


# --- status handling ---------------------------------------------------------------------------------------


def cloudflare(h: RequestHandler) -> None:
    if h.headers["User-Agent"] == "opencode":
        h.reply(200, b"welcome, honest client", "text/plain")
    else:
        h.reply(403, b"challenge page", "text/html", cf_mitigated="challenge")


async def test_cloudflare_challenge_is_retried_once_with_an_honest_user_agent(
    guard: Guard, server: LoopbackServer
) -> None:
    server.routes["/cf"] = cloudflare
    result = await fetch({"url": server.url("/cf")})
    assert result.output == "welcome, honest client"
    assert [s.headers["user-agent"] for s in server.seen] == [BROWSER_USER_AGENT, "opencode"]


async def test_a_plain_403_is_not_retried(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/forbidden"] = text("no", "text/plain", 403)
    server.routes["/other-challenge"] = text("no", "text/html", 403, cf_mitigated="block")
    assert await failure({"url": server.url("/forbidden")}) == "Request failed with status code: 403"
    assert await failure({"url": server.url("/other-challenge")}) == "Request failed with status code: 403"
    assert len(server.seen) == 2


async def test_a_challenge_that_persists_fails_with_its_status(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/always"] = text("no", "text/html", 403, cf_mitigated="challenge")
    assert await failure({"url": server.url("/always")}) == "Request failed with status code: 403"
    assert len(server.seen) == 2


@pytest.mark.parametrize("status", [404, 500, 204])
async def test_status_codes(guard: Guard, server: LoopbackServer, status: int) -> None:
    server.routes["/s"] = text(b"" if status == 204 else b"body", "text/plain", status)
    if status == 204:
        assert (await fetch({"url": server.url("/s")})).output == ""
    else:
        assert await failure({"url": server.url("/s")}) == f"Request failed with status code: {status}"


async def test_non_2xx_is_reported_before_the_size_check(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/big404"] = lambda h: h.reply(404, b"x" * (MB5 + 1), "text/plain")
    assert await failure({"url": server.url("/big404")}) == "Request failed with status code: 404"


async def test_redirects_are_followed(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/old"] = redirect("/page", 301)
    result = await fetch({"url": server.url("/old")})
    assert result.output == PAGE_MARKDOWN
    assert result.title == f"{server.url('/old')} (text/html; charset=utf-8)"


# --- size cap --------------------------------------------------------------------------------------------


async def test_five_megabytes_by_header_and_by_body(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/declared"] = declared(MB5 + 1)
    server.routes["/streamed"] = streamed(MB5 + 1, "text/plain")
    server.routes["/exact"] = streamed(MB5, "text/plain")
    for path in ("/declared", "/streamed"):
        assert await failure({"url": server.url(path)}) == "Response too large (exceeds 5MB limit)"
    assert len((await fetch({"url": server.url("/exact")})).output) == MB5


# --- time limits --------------------------------------------------------------------------------------------


async def test_timeout(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/slow"] = slow(10)
    started = time.monotonic()
    assert await failure({"url": server.url("/slow"), "timeout": 0.3}) == "The operation was aborted."
    assert time.monotonic() - started < 2


async def test_timeout_is_capped_at_120_seconds(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/slow"] = slow(10)
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, abort.set)
    # A 500 s timeout would report "after 500 seconds" if it were not capped; the abort ends the wait early.
    assert await failure({"url": server.url("/slow"), "timeout": 500}, abort=abort) == "Tool execution aborted"


async def test_abort(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/slow"] = slow(10)
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, abort.set)
    started = time.monotonic()
    assert await failure({"url": server.url("/slow")}, abort=abort) == "Tool execution aborted"
    assert time.monotonic() - started < 2


# --- permission and validation --------------------------------------------------------------------------------


async def test_asks_webfetch_permission_with_the_url(guard: Guard, server: LoopbackServer) -> None:
    recorder = Recorder()
    await fetch({"url": server.url("/page"), "format": "text", "timeout": 5}, recorder)
    await fetch({"url": server.url("/page"), "format": "html"}, recorder)
    url = server.url("/page")
    assert recorder.asks == [
        PermissionAsk("webfetch", [url], ["*"], {"url": url, "format": "text", "timeout": 5}),
        PermissionAsk("webfetch", [url], ["*"], {"url": url, "format": "html"}),
    ]


async def test_a_denied_permission_fetches_nothing(guard: Guard, server: LoopbackServer) -> None:
    recorder = Recorder(deny={"webfetch"})
    message = await failure({"url": server.url("/page")}, recorder=recorder)
    assert message == "The user rejected permission to use this specific tool call."
    assert server.connections == 0


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/", "127.0.0.1/page", "HTTP://127.0.0.1/", "file:///etc/passwd", ""])
async def test_url_must_start_with_http_or_https(guard: Guard, url: str) -> None:
    recorder = Recorder()
    assert await failure({"url": url}, recorder=recorder) == "URL must start with http:// or https://"
    assert recorder.asks == []


# --- the egress policy ------------------------------------------------------------------------------------------


async def test_default_tool_refuses_loopback_before_connecting(guard: Guard, server: LoopbackServer) -> None:
    definition = await webfetch.TOOL.init(InitContext(agent="build"))
    recorder = Recorder()
    with pytest.raises(ToolError) as info:
        await definition.execute({"url": server.url("/page")}, tool_context(recorder))
    assert str(info.value) == (
        f"Refusing to fetch {server.url('/page')}: 127.0.0.1 is a loopback address "
        "(blocked by the platform's egress policy)"
    )
    assert len(recorder.asks) == 1
    assert guard.connections == []
    assert server.connections == 0


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.0.0.1/", "10.0.0.1 is a private address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://[::1]:8080/", "::1 is a loopback address"),
    ],
)
async def test_default_tool_refuses_internal_addresses(guard: Guard, url: str, reason: str) -> None:
    definition = await webfetch.TOOL.init(InitContext(agent="build"))
    with pytest.raises(ToolError) as info:
        await definition.execute({"url": url}, tool_context(Recorder()))
    assert str(info.value) == f"Refusing to fetch {url}: {reason} (blocked by the platform's egress policy)"
    assert guard.connections == []


async def test_default_tool_refuses_a_name_that_resolves_to_loopback(guard: Guard, server: LoopbackServer) -> None:
    url = server.url("/page", host="localhost")
    message = await failure({"url": url}, policy=EgressPolicy())
    assert message.startswith(f"Refusing to fetch {url}: localhost resolves to ")
    assert message.endswith(", a loopback address (blocked by the platform's egress policy)")
    assert guard.connections == []
    assert server.connections == 0


async def test_redirect_to_a_refused_address_is_refused(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/escape"] = redirect("http://169.254.169.254/latest/meta-data/")
    assert await failure({"url": server.url("/escape")}) == (
        "Refusing to fetch http://169.254.169.254/latest/meta-data/: 169.254.169.254 is a cloud metadata address "
        "(blocked by the platform's egress policy)"
    )
    assert guard.connections == ["127.0.0.1"]
