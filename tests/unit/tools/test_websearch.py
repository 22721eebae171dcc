"""websearch and codesearch against a local provider speaking JSON-RPC over SSE, and unconfigured."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.core.calls.tool import InitContext, PermissionAsk, ToolError, ToolInfo, ToolResult
from controlplane.errors import ConfigError
from controlplane.tools import codesearch, websearch
from controlplane.tools.websearch import SearchConfig, first_text
from tests.unit.tools.web_support import (
    Guard,
    LoopbackServer,
    Recorder,
    RequestHandler,
    redirect,
    slow,
    text,
    tool_context,
)

KEY = "test-key-123"
WEB_EMPTY = "No search results found. Please try a different query."
CODE_EMPTY = (
    "No code snippets or documentation found. Please try a different query, be more specific about the library or "
    "programming concept, or check the spelling of framework names."
)


def sse(*payloads: object, event: bool = True) -> bytes:
    lines = []
    for payload in payloads:
        if event:
            lines.append("event: message")
        lines.append("data: " + json.dumps(payload))
        lines.append("")
    return ("\n".join(lines) + "\n").encode()


def content(*texts: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": t} for t in texts]}}


def provider(body: bytes, status: int = 200) -> Any:
    return lambda h: h.reply(status, body, "text/event-stream")


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as srv:
        srv.routes["/mcp"] = provider(sse(content("result one", "result two")))
        yield srv


def config(server: LoopbackServer, **overrides: Any) -> SearchConfig:
    return SearchConfig(**{"endpoint": server.url("/mcp"), "api_key": KEY, **overrides})


async def run(tool: ToolInfo, args: dict[str, Any], recorder: Recorder | None = None,
              abort: asyncio.Event | None = None) -> ToolResult:
    definition = await tool.init(InitContext(agent="build"))
    return await definition.execute(args, tool_context(recorder or Recorder(), abort))


async def failure(tool: ToolInfo, args: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ToolError) as info:
        await run(tool, args, **kwargs)
    return str(info.value)


# --- not configured ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args"),
    [(websearch.TOOL, {"query": "q"}), (codesearch.TOOL, {"query": "q", "tokensNum": 5000})],
)
async def test_unconfigured_tools_say_so_and_ask_nothing(guard: Guard, tool: ToolInfo, args: dict[str, Any]) -> None:
    recorder = Recorder()
    assert await failure(tool, args, recorder=recorder) == (
        f"{tool.id} is not configured on this platform: the operator must set [search] endpoint and api_key"
    )
    assert recorder.asks == []
    assert guard.connections == []


async def test_a_key_without_an_endpoint_is_not_configured(guard: Guard) -> None:
    tool = websearch.make_tool(SearchConfig(api_key=KEY))
    assert (await failure(tool, {"query": "q"})).startswith("websearch is not configured on this platform")


def test_endpoint_must_be_http() -> None:
    with pytest.raises(ConfigError):
        SearchConfig(endpoint="ftp://search.example/mcp", api_key=KEY)


# --- websearch ----------------------------------------------------------------------------------------------


async def test_websearch_posts_json_rpc_and_returns_the_first_text(guard: Guard, server: LoopbackServer) -> None:
    result = await run(websearch.make_tool(config(server)), {"query": "python 3.14 release"})
    assert result == ToolResult(title="Web search: python 3.14 release", output="result one", metadata={})
    (request,) = server.seen
    assert request.method == "POST"
    assert json.loads(request.body) == {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "web_search_exa", "arguments": {
            "query": "python 3.14 release", "type": "auto", "numResults": 8, "livecrawl": "fallback",
        }},
    }
    assert list(json.loads(request.body)["params"]["arguments"]) == ["query", "type", "numResults", "livecrawl"]
    assert request.headers["accept"] == "application/json, text/event-stream"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-api-key"] == KEY


async def test_websearch_passes_its_options_and_asks_with_them(guard: Guard, server: LoopbackServer) -> None:
    recorder = Recorder()
    args = {"query": "rust async", "numResults": 3, "livecrawl": "preferred", "type": "deep",
            "contextMaxCharacters": 2000}
    await run(websearch.make_tool(config(server)), args, recorder)
    assert json.loads(server.seen[0].body)["params"]["arguments"] == {
        "query": "rust async", "type": "deep", "numResults": 3, "livecrawl": "preferred", "contextMaxCharacters": 2000,
    }
    assert recorder.asks == [PermissionAsk("websearch", ["rust async"], ["*"], args)]


async def test_websearch_ask_leaves_out_options_not_given(guard: Guard, server: LoopbackServer) -> None:
    recorder = Recorder()
    await run(websearch.make_tool(config(server)), {"query": "q", "numResults": 0}, recorder)
    assert recorder.asks == [PermissionAsk("websearch", ["q"], ["*"], {"query": "q", "numResults": 0})]
    # `numResults: 0` falls back to 8, as JavaScript's `||` does.
    assert json.loads(server.seen[0].body)["params"]["arguments"]["numResults"] == 8


async def test_a_denied_search_sends_nothing(guard: Guard, server: LoopbackServer) -> None:
    message = await failure(websearch.make_tool(config(server)), {"query": "q"}, recorder=Recorder(deny={"websearch"}))
    assert message == "The user rejected permission to use this specific tool call."
    assert server.seen == []


@pytest.mark.parametrize(
    "body",
    [
        sse({"jsonrpc": "2.0", "id": 1, "result": {"content": []}}),
        sse({"jsonrpc": "2.0", "id": 1, "result": {}}),
        b"event: ping\n\n",
        b"",
        json.dumps(content("plain JSON is not SSE")).encode(),
        b"data:" + json.dumps(content("no space after the colon")).encode() + b"\n",
    ],
)
async def test_websearch_without_results(guard: Guard, server: LoopbackServer, body: bytes) -> None:
    server.routes["/mcp"] = provider(body)
    assert (await run(websearch.make_tool(config(server)), {"query": "q"})).output == WEB_EMPTY


async def test_the_first_data_line_with_content_wins(guard: Guard, server: LoopbackServer) -> None:
    body = sse({"jsonrpc": "2.0", "method": "notifications/progress"}, {"result": {"content": []}},
               content("second event"), content("third event"), event=False)
    server.routes["/mcp"] = provider(body.replace(b"\n", b"\r\n"))
    assert (await run(websearch.make_tool(config(server)), {"query": "q"})).output == "second event"


async def test_websearch_error_status_includes_the_body(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/mcp"] = text('{"error":"invalid api key"}', "application/json", 401)
    assert await failure(websearch.make_tool(config(server)), {"query": "q"}) == (
        'Search error (401): {"error":"invalid api key"}'
    )


async def test_websearch_timeout(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/mcp"] = slow(10)
    started = time.monotonic()
    assert await failure(websearch.make_tool(config(server, timeout=0.3)), {"query": "q"}) == "Search request timed out"
    assert time.monotonic() - started < 2


async def test_websearch_abort(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/mcp"] = slow(10)
    abort = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, abort.set)
    assert await failure(websearch.make_tool(config(server)), {"query": "q"}, abort=abort) == "Tool execution aborted"


async def test_invalid_json_in_a_data_line_is_an_error(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/mcp"] = provider(b"data: {not json\n\n")
    message = await failure(websearch.make_tool(config(server)), {"query": "q"})
    assert message.startswith("Search error: the provider sent invalid JSON (")


def test_first_text_reads_only_the_first_content_item() -> None:
    assert first_text("data: " + json.dumps(content("a", "b")), "E") == "a"
    assert first_text('data: {"result": {"content": [{"type": "image"}]}}', "E") is None
    assert first_text('data: [1, 2]\ndata: {"result": {"content": [{"text": "x"}]}}', "E") == "x"


async def test_websearch_description_names_the_current_year() -> None:
    definition = await websearch.TOOL.init(InitContext(agent="build"))
    year = str(datetime.date.today().year)
    assert f"The current year is {year}." in definition.description
    assert "${" not in definition.description


# --- the provider endpoint and the egress policy --------------------------------------------------------------


async def test_the_configured_endpoint_is_trusted_even_on_loopback(guard: Guard, server: LoopbackServer) -> None:
    # The default policy refuses loopback, but the operator named this endpoint.
    result = await run(websearch.make_tool(config(server)), {"query": "q"})
    assert result.output == "result one"
    assert guard.connections == ["127.0.0.1"]


async def test_a_provider_redirect_to_a_refused_address_is_refused(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/mcp"] = redirect("http://169.254.169.254/latest/meta-data/", 307)
    assert await failure(websearch.make_tool(config(server)), {"query": "q"}) == (
        "Search error: Refusing to fetch http://169.254.169.254/latest/meta-data/: 169.254.169.254 is a cloud "
        "metadata address (blocked by the platform's egress policy)"
    )
    assert guard.connections == ["127.0.0.1"]


async def test_the_key_is_sent_in_the_configured_header(guard: Guard, server: LoopbackServer) -> None:
    await run(websearch.make_tool(config(server, api_key_header="Authorization", api_key="Bearer k")), {"query": "q"})
    assert server.seen[0].headers["authorization"] == "Bearer k"
    assert "x-api-key" not in server.seen[0].headers


# --- codesearch -----------------------------------------------------------------------------------------------


def record_args(h: RequestHandler) -> None:
    arguments = json.loads(h.server.seen[-1].body)["params"]["arguments"]
    h.reply(200, sse(content(json.dumps(arguments))), "text/event-stream")


async def test_codesearch_calls_get_code_context(guard: Guard, server: LoopbackServer) -> None:
    recorder = Recorder()
    result = await run(codesearch.make_tool(config(server)), {"query": "React useState", "tokensNum": 5000}, recorder)
    assert result == ToolResult(title="Code search: React useState", output="result one", metadata={})
    assert json.loads(server.seen[0].body) == {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "get_code_context_exa", "arguments": {"query": "React useState", "tokensNum": 5000}},
    }
    assert recorder.asks == [
        PermissionAsk("codesearch", ["React useState"], ["*"], {"query": "React useState", "tokensNum": 5000})
    ]


async def test_codesearch_tokens_default_to_5000(guard: Guard, server: LoopbackServer) -> None:
    server.routes["/mcp"] = record_args
    tool = codesearch.make_tool(config(server))
    assert (await run(tool, {"query": "q"})).output == '{"query": "q", "tokensNum": 5000}'
    assert (await run(tool, {"query": "q", "tokensNum": 1234.0})).output == '{"query": "q", "tokensNum": 1234}'


async def test_codesearch_empty_error_and_timeout(guard: Guard, server: LoopbackServer) -> None:
    tool = codesearch.make_tool(config(server, timeout=0.3))
    server.routes["/mcp"] = provider(sse({"result": {"content": []}}))
    assert (await run(tool, {"query": "q", "tokensNum": 5000})).output == CODE_EMPTY
    server.routes["/mcp"] = text("rate limited", "text/plain", 429)
    assert await failure(tool, {"query": "q", "tokensNum": 5000}) == "Code search error (429): rate limited"
    server.routes["/mcp"] = slow(10)
    assert await failure(tool, {"query": "q", "tokensNum": 5000}) == "Code search request timed out"
