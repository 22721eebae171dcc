"""`codesearch`: documentation and code context for libraries and APIs, from the operator's search provider."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from controlplane import egress
from controlplane.core.calls.tool import InitContext, PermissionAsk, ToolContext, ToolDefinition, ToolInfo, ToolResult
from controlplane.tools.describe import description
from controlplane.tools.websearch import ProviderCall, SearchConfig, call_provider, not_configured

DEFAULT_TOKENS = 5000
CODESEARCH_TIMEOUT_S = 30.0
NO_RESULTS = (
    "No code snippets or documentation found. Please try a different query, be more specific about the library or "
    "programming concept, or check the spelling of framework names."
)


class CodeSearchParams(BaseModel):
    query: str = Field(
        description=(
            "Search query to find relevant context for APIs, Libraries, and SDKs. For example, 'React useState hook "
            "examples', 'Python pandas dataframe filtering', 'Express.js middleware', 'Next js partial prerendering "
            "configuration'"
        )
    )
    tokens_num: float = Field(
        DEFAULT_TOKENS,
        alias="tokensNum",
        ge=1000,
        le=50000,
        description=(
            "Number of tokens to return (1000-50000). Default is 5000 tokens. Adjust this value based on how much "
            "context you need - use lower values for focused queries and higher values for comprehensive "
            "documentation."
        ),
    )


def make_tool(config: SearchConfig | None = None, policy: egress.EgressPolicy | None = None) -> ToolInfo:
    search = config or SearchConfig()
    egress_policy = policy or egress.EgressPolicy()

    async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not search.configured:
            raise not_configured("codesearch")
        query: str = args["query"]
        tokens = args.get("tokensNum")
        await ctx.ask(PermissionAsk("codesearch", [query], ["*"], {"query": query, "tokensNum": tokens}))
        tokens = tokens or DEFAULT_TOKENS
        if isinstance(tokens, float) and tokens.is_integer():
            tokens = int(tokens)
        call = ProviderCall(
            "get_code_context_exa", {"query": query, "tokensNum": tokens}, search.timeout or CODESEARCH_TIMEOUT_S,
            "Code search error", "Code search request timed out",
        )
        text = await call_provider(call, search, egress_policy, ctx)
        return ToolResult(title=f"Code search: {query}", output=NO_RESULTS if text is None else text, metadata={})

    async def init(_: InitContext) -> ToolDefinition:
        return ToolDefinition(description("codesearch"), CodeSearchParams, execute)

    return ToolInfo(id="codesearch", init=init)


TOOL = make_tool()
"""Unconfigured: every call explains that the operator has to set the search provider up."""
