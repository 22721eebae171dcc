"""A complete agent loop: a model behind an OpenAI- or Anthropic-compatible HTTP API, the platform's sandboxed
tools, live output, and an explicit permission policy.

    AGENT_API=openai|anthropic         which wire format the endpoint speaks (default: openai)
    AGENT_BASE_URL=https://...          the API's base URL (OpenAI-style: up to /v1; Anthropic-style: before /v1)
    AGENT_API_KEY=...                   sent as a bearer token (OpenAI) or x-api-key (Anthropic)
    AGENT_MODEL=...                     the model's name
    AGENT_WORKSPACE=DIR                 optional: a directory to upload as the session's workspace
    AGENT_ALLOW=read,glob,grep,bash     optional: the permissions approved once when asked (others are rejected)
    CONTROLPLANE_TARGET / _TOKEN        optional: found as the CLI finds them otherwise

    python examples/agent_loop.py "What does notes.txt say? Count its lines with wc."

The policy never approves anything that touches a `.env` file, whatever AGENT_ALLOW says.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from controlplane import formats
from controlplane.client import AsyncClient, PermissionRequest, Reply, ToolEvent, ToolOutcome, connect
from controlplane.v1 import tool_pb2

MAX_TURNS = 20
SYSTEM = "You are a coding agent. Use the tools to inspect the workspace at /workspace; answer briefly."
SECRETS = ("*.env", "*.env.*", ".env")


def permission_policy(allowed: set[str]) -> Callable[[PermissionRequest], tuple[int, str]]:
    """Approves once the permissions in `allowed`, except on secrets; rejects the rest with a reason the
    model reads (so that it can try something else instead of retrying)."""

    def decide(request: PermissionRequest) -> tuple[int, str]:
        touched = [p for p in request.patterns if any(fnmatch.fnmatch(os.path.basename(p), s) for s in SECRETS)]
        if touched:
            print(f"[permission] {request.permission} {touched}: rejected (secrets)", file=sys.stderr)
            return Reply.REJECT, f"Secrets ({', '.join(touched)}) are off limits in this session."
        if request.permission in allowed:
            print(f"[permission] {request.permission} {list(request.patterns)}: approved once", file=sys.stderr)
            return Reply.ONCE, ""
        print(f"[permission] {request.permission} {list(request.patterns)}: rejected", file=sys.stderr)
        return Reply.REJECT, f"The {request.permission} permission is not granted in this session."

    return decide


def live_output() -> Callable[[ToolEvent], None]:
    """Prints what a running call streams (bash's output grows in its metadata), as it arrives."""
    printed: dict[str, int] = {}

    def on_event(event: ToolEvent) -> None:
        if event.WhichOneof("event") != "metadata":
            return
        output = json.loads(event.metadata.metadata_json or "{}").get("output")
        if isinstance(output, str):
            start = printed.get(event.call_id, 0)
            sys.stderr.write(output[start:])
            printed[event.call_id] = len(output)

    return on_event


class Agent:
    def __init__(self, client: AsyncClient, session_id: str, http: httpx.AsyncClient, api: str, model: str,
                 allowed: set[str]) -> None:
        self.client, self.session_id, self.http, self.api, self.model = client, session_id, http, api, model
        self.policy = permission_policy(allowed)

    async def call_tool(self, name: str, args: dict[str, Any], call_id: str) -> ToolOutcome:
        print(f"[tool] {name} {json.dumps(args)}", file=sys.stderr)
        return await self.client.execute_tool(self.session_id, name, args, call_id=call_id,
                                              on_permission=self.policy, on_event=live_output())

    async def run(self, prompt: str) -> str:
        listing = await self.client.list_tools(self.session_id, model_id=self.model)
        if self.api == "anthropic":
            return await self._anthropic(listing, prompt)
        return await self._openai(listing, prompt)

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        response = await self.http.post(path, json=body, headers=headers)
        response.raise_for_status()
        reply: dict[str, Any] = response.json()
        return reply

    async def _openai(self, listing: tool_pb2.ListToolsResponse, prompt: str) -> str:
        tools = formats.to_openai(listing, strict=True)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        for _ in range(MAX_TURNS):
            reply = await self._post("/chat/completions", {"model": self.model, "messages": messages, "tools": tools},
                                     {})
            message = reply["choices"][0]["message"]
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                return str(message.get("content") or "")
            # The model's calls in one turn run concurrently, as OpenCode runs them.
            outcomes = await asyncio.gather(*(
                self.call_tool(c["function"]["name"], formats.from_openai_arguments(
                    listing, c["function"]["name"], c["function"]["arguments"], strict=True), c["id"])
                for c in calls
            ))
            for call, outcome in zip(calls, outcomes, strict=True):
                messages.append(formats.openai_tool_message(call["id"], outcome))
                if (images := formats.openai_attachment_message(outcome)) is not None:
                    messages.append(images)
        raise RuntimeError(f"no final answer after {MAX_TURNS} turns")

    async def _anthropic(self, listing: tool_pb2.ListToolsResponse, prompt: str) -> str:
        tools = formats.to_anthropic(listing)
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        for _ in range(MAX_TURNS):
            reply = await self._post("/v1/messages", {
                "model": self.model, "max_tokens": 4096, "system": SYSTEM, "messages": messages, "tools": tools,
            }, {"anthropic-version": "2023-06-01"})
            messages.append({"role": "assistant", "content": reply["content"]})
            uses = [block for block in reply["content"] if block.get("type") == "tool_use"]
            if not uses:
                return "".join(b.get("text", "") for b in reply["content"] if b.get("type") == "text")
            outcomes = await asyncio.gather(*(self.call_tool(u["name"], u["input"], u["id"]) for u in uses))
            messages.append({"role": "user", "content": [
                formats.anthropic_tool_result(u["id"], outcome) for u, outcome in zip(uses, outcomes, strict=True)
            ]})
        raise RuntimeError(f"no final answer after {MAX_TURNS} turns")


async def main(prompt: str) -> int:
    api = os.environ.get("AGENT_API", "openai")
    if api not in ("openai", "anthropic"):
        raise SystemExit(f"AGENT_API must be openai or anthropic, not {api!r}")
    base_url, model = os.environ.get("AGENT_BASE_URL"), os.environ.get("AGENT_MODEL")
    if not base_url or not model:
        raise SystemExit("set AGENT_BASE_URL and AGENT_MODEL (and AGENT_API_KEY) to name the model's endpoint")
    key = os.environ.get("AGENT_API_KEY", "")
    headers = {"x-api-key": key} if api == "anthropic" else {"authorization": f"Bearer {key}"}
    allowed = {p.strip() for p in os.environ.get("AGENT_ALLOW", "read,glob,grep,list,bash").split(",") if p.strip()}
    workspace = Path(os.environ["AGENT_WORKSPACE"]) if os.environ.get("AGENT_WORKSPACE") else None
    async with connect() as client, httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as http:
        session = await client.create_session(workspace=workspace)
        try:
            answer = await Agent(client, session.id, http, api, model, allowed).run(prompt)
        finally:
            await client.delete_session(session.id)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(" ".join(sys.argv[1:]) or "Describe the workspace.")))
