"""`websearch`: a web search through the operator's search provider (an Exa-style MCP endpoint).

The endpoint and key are operator configuration, used only in the control plane; the sandbox never
sees them. Without them the tool explains that it is not configured.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

from controlplane import egress
from controlplane.core.calls.executor import ABORTED
from controlplane.core.calls.tool import (
    InitContext,
    PermissionAsk,
    ToolContext,
    ToolDefinition,
    ToolError,
    ToolInfo,
    ToolResult,
)
from controlplane.errors import ConfigError
from controlplane.tools.describe import description

DEFAULT_NUM_RESULTS = 8
WEBSEARCH_TIMEOUT_S = 25.0
NO_RESULTS = "No search results found. Please try a different query."


@dataclass(frozen=True)
class SearchConfig:
    """The operator's search provider: a JSON-RPC `tools/call` endpoint answering in SSE."""

    endpoint: str = ""
    api_key: str = ""
    timeout: float | None = None
    """Seconds; None keeps each tool's own (websearch 25, codesearch 30)."""
    api_key_header: str = "x-api-key"

    @property
    def configured(self) -> bool:
        return bool(self.endpoint and self.api_key)

    def __post_init__(self) -> None:
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"search endpoint must be an http:// or https:// URL, not {self.endpoint!r}")


def not_configured(tool_id: str) -> ToolError:
    return ToolError(
        f"{tool_id} is not configured on this platform: the operator must set [search] endpoint and api_key"
    )


@dataclass(frozen=True)
class ProviderCall:
    """One `tools/call` of the provider and the texts the calling tool reports its failures with."""

    tool: str
    arguments: dict[str, Any]
    timeout: float
    error_prefix: str
    """`Search error` gives `Search error ({status}): {body}`."""
    timeout_message: str


async def call_provider(
    call: ProviderCall, config: SearchConfig, policy: egress.EgressPolicy, ctx: ToolContext,
) -> str | None:
    """The first `result.content[0].text` of the provider's SSE reply, or None when it has none."""
    request = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": call.tool, "arguments": call.arguments},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        config.api_key_header: config.api_key,
    }
    # The endpoint is the operator's own choice, so its host is trusted; redirects elsewhere are still vetted.
    trusted = policy.trusting([httpx.URL(config.endpoint).host])

    async def post() -> tuple[int, bytes]:
        async with egress.open_url(config.endpoint, trusted, method="POST", headers=headers,
                                   content=json.dumps(request).encode()) as response:
            return response.status, await response.read()

    try:
        status, body = await egress.bounded(post(), seconds=call.timeout, abort=ctx.abort)
    except egress.FetchAbortedError as exc:
        raise ToolError(ABORTED) from exc
    except egress.FetchTimeoutError as exc:
        raise ToolError(call.timeout_message) from exc
    except egress.EgressError as exc:
        raise ToolError(f"{call.error_prefix}: {exc}") from exc
    text = body.decode("utf-8", errors="replace")
    if not 200 <= status < 300:
        raise ToolError(f"{call.error_prefix} ({status}): {text}")
    return first_text(text, call.error_prefix)


def first_text(sse: str, error_prefix: str) -> str | None:
    """The first non-empty `result.content` list's first `text` among the `data: ` lines."""
    for line in sse.split("\n"):
        if not line.startswith("data: "):
            continue
        try:
            data = json.loads(line[len("data: "):])
        except json.JSONDecodeError as exc:
            raise ToolError(f"{error_prefix}: the provider sent invalid JSON ({exc})") from exc
        result = data.get("result") if isinstance(data, dict) else None
        content = result.get("content") if isinstance(result, dict) else None
        if isinstance(content, list) and content:
            first = content[0]
            text = first.get("text") if isinstance(first, dict) else None
            return text if isinstance(text, str) else None
    return None


def defined(**values: object) -> dict[str, Any]:
    """Like JSON of a JavaScript object: keys whose value is undefined are left out."""
    return {k: v for k, v in values.items() if v is not None}


class WebSearchParams(BaseModel):
    query: str = Field(description="Websearch query")
    num_results: float | None = Field(
        None, alias="numResults", description="Number of search results to return (default: 8)"
    )
    livecrawl: Literal["fallback", "preferred"] | None = Field(
        None,
        description=(
            "Live crawl mode - 'fallback': use live crawling as backup if cached content unavailable, "
            "'preferred': prioritize live crawling (default: 'fallback')"
        ),
    )
    type: Literal["auto", "fast", "deep"] | None = Field(
        None,
        description=(
            "Search type - 'auto': balanced search (default), 'fast': quick results, 'deep': comprehensive search"
        ),
    )
    context_max_characters: float | None = Field(
        None,
        alias="contextMaxCharacters",
        description="Maximum characters for context string optimized for LLMs (default: 10000)",
    )


def make_tool(config: SearchConfig | None = None, policy: egress.EgressPolicy | None = None) -> ToolInfo:
    search = config or SearchConfig()
    egress_policy = policy or egress.EgressPolicy()

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not search.configured:
            raise not_configured("websearch")
        query: str = args["query"]
        options = defined(numResults=args.get("numResults"), livecrawl=args.get("livecrawl"), type=args.get("type"),
                          contextMaxCharacters=args.get("contextMaxCharacters"))
        await ctx.ask(PermissionAsk("websearch", [query], ["*"], {"query": query, **options}))
        # `||` defaults, as upstream applies them: 0 and "" also fall back.
        arguments = {
            "query": query,
            "type": args.get("type") or "auto",
            "numResults": _number(args.get("numResults")) or DEFAULT_NUM_RESULTS,
            "livecrawl": args.get("livecrawl") or "fallback",
            **defined(contextMaxCharacters=_number(args.get("contextMaxCharacters"))),
        }
        call = ProviderCall("web_search_exa", arguments, search.timeout or WEBSEARCH_TIMEOUT_S,
                            "Search error", "Search request timed out")
        text = await call_provider(call, search, egress_policy, ctx)
        return ToolResult(title=f"Web search: {query}", output=NO_RESULTS if text is None else text, metadata={})

    async def init(_: InitContext) -> ToolDefinition:
        return ToolDefinition(description("websearch", year=datetime.date.today().year), WebSearchParams, execute)

    return ToolInfo(id="websearch", init=init)


def _number(value: Any) -> Any:
    """An integral float as an int, so the JSON sent reads `8`, not `8.0` (JavaScript has one number type)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


TOOL = make_tool()
"""Unconfigured: every call explains that the operator has to set the search provider up."""
