"""`webfetch`: fetches a URL from the control plane (through the egress guard) as markdown, text or HTML."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from typing import Any, Literal

import markdownify
from bs4 import BeautifulSoup, Tag
from bs4.element import Comment, NavigableString
from pydantic import BaseModel, Field

from controlplane import egress
from controlplane.core.calls.executor import ABORTED
from controlplane.core.calls.tool import (
    Attachment,
    InitContext,
    PermissionAsk,
    ToolContext,
    ToolDefinition,
    ToolError,
    ToolInfo,
    ToolResult,
)
from controlplane.tools.describe import description

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 120.0
TIMED_OUT = "The operation was aborted."
"""Upstream's text for its own timeout: fetch rejects with the abort its timer caused."""
CONNECT_FAILED = "Unable to connect. Is the computer able to access the url?"
"""Upstream's text (its runtime's) when no connection could be made."""
CHALLENGE_RETRY_USER_AGENT = "opencode"
"""Sent once more when Cloudflare answers a browser-looking request with a bot challenge."""

ACCEPT = {
    "markdown": "text/markdown;q=1.0, text/x-markdown;q=0.9, text/plain;q=0.8, text/html;q=0.7, */*;q=0.1",
    "text": "text/plain;q=1.0, text/markdown;q=0.9, text/html;q=0.8, */*;q=0.1",
    "html": "text/html;q=1.0, application/xhtml+xml;q=0.9, text/plain;q=0.8, text/markdown;q=0.7, */*;q=0.1",
}
NOT_IMAGES = frozenset({"image/svg+xml", "image/vnd.fastbidsheet"})
"""Image types that are text (or not renderable) and so are returned as content, not as an attachment."""


class WebFetchParams(BaseModel):
    url: str = Field(description="The URL to fetch content from")
    format: Literal["text", "markdown", "html"] = Field(
        "markdown", description="The format to return the content in (text, markdown, or html). Defaults to markdown."
    )
    timeout: float | None = Field(None, description="Optional timeout in seconds (max 120)")


def make_tool(policy: egress.EgressPolicy) -> ToolInfo:
    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await fetch_url(args, ctx, policy)

    async def init(_: InitContext) -> ToolDefinition:
        return ToolDefinition(description("webfetch"), WebFetchParams, execute)

    return ToolInfo(id="webfetch", init=init)


TOOL = make_tool(egress.EgressPolicy())
"""With the default egress policy; the control plane builds its own from the operator's config."""


async def fetch_url(args: dict[str, Any], ctx: ToolContext, policy: egress.EgressPolicy) -> ToolResult:
    url: str = args["url"]
    if not url.startswith(("http://", "https://")):
        raise ToolError("URL must start with http:// or https://")
    fmt: str = args.get("format") or "markdown"
    timeout: float | None = args.get("timeout")
    await ctx.ask(PermissionAsk("webfetch", [url], ["*"], _defined(url=url, format=fmt, timeout=timeout)))
    seconds = min(DEFAULT_TIMEOUT_S if timeout is None else timeout, MAX_TIMEOUT_S)
    try:
        content_type, body = await egress.bounded(_download(url, fmt, policy), seconds=seconds, abort=ctx.abort)
    except egress.FetchAbortedError as exc:
        raise ToolError(ABORTED) from exc
    except egress.FetchTimeoutError as exc:
        raise ToolError(TIMED_OUT) from exc
    except egress.FetchConnectError as exc:
        raise ToolError(CONNECT_FAILED) from exc
    except egress.EgressError as exc:
        raise ToolError(str(exc)) from exc
    return _result(url, fmt, content_type, body)


def _defined(**values: object) -> dict[str, Any]:
    """Like JSON of a JavaScript object: keys whose value is undefined are left out."""
    return {k: v for k, v in values.items() if v is not None}


async def _download(url: str, fmt: str, policy: egress.EgressPolicy) -> tuple[str, bytes]:
    headers = {
        "User-Agent": policy.user_agent,
        "Accept": ACCEPT.get(fmt, "*/*"),
        "Accept-Language": "en-US,en;q=0.9",
    }
    async with egress.open_url(url, policy, headers=headers) as response:
        if not _challenged(response):
            return await _content(response)
    async with egress.open_url(url, policy, headers={**headers, "User-Agent": CHALLENGE_RETRY_USER_AGENT}) as retry:
        return await _content(retry)


def _challenged(response: egress.Fetched) -> bool:
    return response.status == 403 and response.headers.get("cf-mitigated") == "challenge"


async def _content(response: egress.Fetched) -> tuple[str, bytes]:
    if not response.ok:
        raise ToolError(f"Request failed with status code: {response.status}")
    body = await response.read()
    return response.headers.get("content-type", ""), body


def _result(url: str, fmt: str, content_type: str, body: bytes) -> ToolResult:
    title = f"{url} ({content_type})"
    mime = content_type.split(";")[0].strip().lower()
    if mime.startswith("image/") and mime not in NOT_IMAGES:
        data = base64.b64encode(body).decode("ascii")
        return ToolResult(title=title, output="Image fetched successfully", metadata={},
                          attachments=[Attachment(mime=mime, url=f"data:{mime};base64,{data}")])
    text = _decode(body)
    if "text/html" in content_type:
        if fmt == "markdown":
            text = html_to_markdown(text)
        elif fmt == "text":
            text = html_to_text(text)
    return ToolResult(title=title, output=text, metadata={})


def _decode(body: bytes) -> str:
    # As a WHATWG TextDecoder("utf-8") does: invalid bytes become U+FFFD and a leading BOM is dropped.
    return body.decode("utf-8", errors="replace").removeprefix("\ufeff")


# ---------------------------------------------------------------------------------------------
# HTML conversions


REMOVED_FOR_MARKDOWN = ("script", "style", "meta", "link")
SKIPPED_FOR_TEXT = frozenset({"script", "style", "noscript", "iframe", "object", "embed"})


def html_to_markdown(html: str) -> str:
    """Markdown as upstream's Turndown writes it: `#` headings, `-   ` bullets, fenced code, `*` emphasis, `---` rules,
    tables and definition lists as plain blocks, and Turndown's escapes."""
    soup = BeautifulSoup(html, "html.parser")
    for element in soup.find_all(REMOVED_FOR_MARKDOWN):
        element.decompose()
    _merge_blank_runs(soup)
    converter = _TurndownLike(
        heading_style=markdownify.ATX, bullets="-", strong_em_symbol=markdownify.ASTERISK,
        code_language_callback=_code_language, wrap=True, wrap_width=None,
    )
    markdown = re.sub(r"\n{3,}", "\n\n", converter.convert_soup(soup))
    # Turndown trims leading line breaks (not spaces) and all trailing whitespace.
    return markdown.lstrip("\t\r\n").rstrip()


def _merge_blank_runs(soup: BeautifulSoup) -> None:
    """Turndown collapses whitespace across neighbouring text nodes and drops it at the document's top level;
    markdownify collapses each node alone, so blank nodes that follow whitespace in document order (as left by
    removed elements) and blank top-level nodes are dropped first."""
    for text in list(soup.find_all(string=True)):
        if not isinstance(text, NavigableString) or isinstance(text, Comment) or text.strip():
            continue
        previous = text.find_previous(string=True)
        if text.find_parent("pre") is not None:
            continue
        if text.parent is soup or (isinstance(previous, NavigableString) and previous[-1:].isspace()):
            text.extract()


_TURNDOWN_ESCAPES = (
    (re.compile(r"\\"), r"\\\\"), (re.compile(r"\*"), r"\\*"), (re.compile(r"^-"), r"\\-"),
    (re.compile(r"^\+ "), r"\\+ "), (re.compile(r"^(=+)"), r"\\\1"), (re.compile(r"^(#{1,6}) "), r"\\\1 "),
    (re.compile(r"`"), r"\\`"), (re.compile(r"^~~~"), r"\\~~~"), (re.compile(r"\["), r"\\["),
    (re.compile(r"\]"), r"\\]"), (re.compile(r"^>"), r"\\>"), (re.compile(r"_"), r"\\_"),
    (re.compile(r"^(\d+)\. "), r"\1\\. "),
)
"""Markdown syntax Turndown escapes in a text node (`^`: only at the node's start)."""


class _TurndownLike(markdownify.MarkdownConverter):
    """markdownify, adjusted where upstream's Turndown (default rules, no plugins) writes otherwise."""

    def escape(self, text: str, parent_tags: set[str]) -> str:
        for pattern, replacement in _TURNDOWN_ESCAPES:
            text = pattern.sub(replacement, text)
        return text

    def _block(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        text = text.strip()
        return f"\n\n{text}\n\n" if text else ""

    # Turndown has no rules for these: their content stands as a block of its own.
    convert_table = convert_thead = convert_tbody = convert_tfoot = convert_tr = convert_td = convert_th = _block
    convert_caption = convert_dl = convert_dt = convert_dd = _block

    def convert_del(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        return text  # no strikethrough without the GFM plugin

    convert_s = convert_strike = convert_del

    def convert_list(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        if "li" in parent_tags:
            return "\n" + text.rstrip()
        return "\n\n" + text + "\n\n"

    convert_ul = convert_ol = convert_list

    def convert_li(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        parent = el.parent
        if parent is not None and parent.name == "ol":
            start = str(parent.get("start") or "")
            first = int(start) if start.isdigit() else 1
            prefix = f"{first + len(el.find_previous_siblings('li'))}.  "
        else:
            prefix = "-   "
        content = text.lstrip("\n").rstrip("\n").replace("\n", "\n    ")
        return prefix + content + "\n"

    def convert_pre(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        first = el.contents[0] if el.contents else None
        if isinstance(first, Tag) and first.name == "code":
            fenced = getattr(super(), "convert_pre")  # noqa: B009 - markdownify's stubs do not declare it
            return str(fenced(el, text.removesuffix("\n"), parent_tags))
        return f"\n\n{text}\n\n" if text else ""

    def convert_code(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        if "_noformat" in parent_tags:
            return text
        runs = {len(run) for run in re.findall(r"`+", text)}
        fence = 1
        while fence in runs:
            fence += 1
        pad = " " if re.search(r"^`|^ .*?[^ ].* $|`$", text) else ""
        return f"{'`' * fence}{pad}{text}{pad}{'`' * fence}"


def _code_language(pre: Tag) -> str | None:
    """The fence's info string, from a `language-x` class on the `<pre>`'s `<code>`."""
    code = pre.find("code")
    if isinstance(code, Tag):
        for cls in code.get_attribute_list("class") or []:
            if cls and cls.startswith("language-"):
                return str(cls.removeprefix("language-"))
    return None


VOID_ELEMENTS = frozenset({
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input", "keygen", "link",
    "meta", "param", "source", "track", "wbr",
})
RAW_TEXT_ELEMENTS = ("script", "style", "iframe", "noscript", "noembed", "noframes", "xmp", "title", "textarea")
"""Elements whose content is text up to their end tag: markup inside them is not parsed."""
_JS_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000\ufeff"
"""What JavaScript's String.prototype.trim() removes."""
_UNFINISHED_MARKUP = re.compile(r"<[a-zA-Z/!?]")


class _TextExtractor(HTMLParser):
    """Upstream's streaming extraction (Bun's HTMLRewriter), quirks included, as observed in Bun:

    - text is kept as written: character references such as `&amp;` are not decoded;
    - only text inside an open element counts (text before the first tag or after the root closes is dropped);
    - a skipped element's start tag turns skipping on, and only the start tag of another element turns it
      off: text after `</script>` (or after a void `<embed>`) is dropped up to the next start tag.
    """

    def __init__(self, ampersand: str) -> None:
        super().__init__(convert_charrefs=False)
        self.ampersand = ampersand
        self.parts: list[str] = []
        self.open: list[str] = []
        self.skipping = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.skipping = tag in SKIPPED_FOR_TEXT
        if tag not in VOID_ELEMENTS:
            self.open.append(tag)
        if tag in RAW_TEXT_ELEMENTS:
            self.set_cdata_mode(tag)  # the parser itself only knows script and style

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)  # in HTML the slash only matters for void elements: `<p/>` opens a p

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        if self.open and not self.skipping:
            self.parts.append(data.replace(self.ampersand, "&"))

    def close(self) -> None:
        # At the end of the input an unfinished tag or comment (`<b`, `<!-- x`) is dropped, while an unclosed
        # raw-text element (`<title/>`, `<textarea>`) runs to the end.
        if self.cdata_elem is None and _UNFINISHED_MARKUP.match(self.rawdata):
            self.rawdata = ""
        super().close()
        if self.rawdata:
            self.handle_data(self.rawdata)
            self.rawdata = ""


def html_to_text(html: str) -> str:
    """The document's text as upstream extracts it, without script, style, noscript, iframe, object or embed
    content (see _TextExtractor for the quirks kept)."""
    # The parser never sees a `&`, so character references reach handle_data exactly as written.
    ampersand = next(c for c in map(chr, range(0xF0000, 0xFFFFE)) if c not in html)
    extractor = _TextExtractor(ampersand)
    extractor.feed(html.replace("&", ampersand))
    extractor.close()
    return "".join(extractor.parts).strip(_JS_SPACE)
