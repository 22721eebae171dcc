"""`webfetch`: fetches a URL from the control plane (through the egress guard) as markdown, text or HTML."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from typing import Any, Literal

import markdownify
from bs4 import BeautifulSoup, Tag
from pydantic import BaseModel, Field

from controlplane import egress
from controlplane.core.executor import ABORTED
from controlplane.core.tool import (
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
        raise ToolError(f"Request timed out after {seconds:g} seconds") from exc
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
_VOID = frozenset({"embed"})
"""Skipped elements that have no end tag, so they hide nothing."""


def html_to_markdown(html: str) -> str:
    """Markdown with `#` headings, `-` bullets, fenced code, `*` emphasis and `---` rules."""
    soup = BeautifulSoup(html, "html.parser")
    for element in soup.find_all(REMOVED_FOR_MARKDOWN):
        element.decompose()
    converter = markdownify.MarkdownConverter(
        heading_style=markdownify.ATX, bullets="-", strong_em_symbol=markdownify.ASTERISK,
        code_language_callback=_code_language,
    )
    markdown = converter.convert_soup(soup)
    return re.sub(r"\n{3,}", "\n\n", markdown).strip()


def _code_language(pre: Tag) -> str | None:
    """The fence's info string, from a `language-x` class on the `<pre>` or its `<code>`."""
    for element in (pre, pre.find("code")):
        if isinstance(element, Tag):
            for cls in element.get_attribute_list("class") or []:
                if cls and cls.startswith("language-"):
                    return str(cls.removeprefix("language-"))
    return None


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in SKIPPED_FOR_TEXT and tag not in _VOID:
            self.skipping += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED_FOR_TEXT and tag not in _VOID and self.skipping:
            self.skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The document's text nodes, in order, without script, style, noscript, iframe, object or embed content."""
    extractor = _TextExtractor()
    extractor.feed(html)
    extractor.close()
    return "".join(extractor.parts).strip()
