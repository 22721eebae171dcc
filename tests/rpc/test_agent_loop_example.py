"""examples/agent_loop.py run as a user runs it, against a local plane and a fake model endpoint this test
serves on loopback: the scripted model reads two files at once (the policy refuses `.env`), runs bash, then
answers. Both wire formats: OpenAI's Chat Completions (strict tools) and Anthropic's Messages."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.planes import REPO, Plane, served_plane

plane = served_plane("local")
KEY = "sk-test-key"
NOTES = "alpha\nbeta\ngamma\n"


class FakeModel:
    """Replies from `script` in order; keeps every request (path, headers, body)."""

    def __init__(self, script: list[Callable[[dict[str, Any]], dict[str, Any]]]) -> None:
        self.script = script
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                model.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                turn = len(model.requests) - 1
                reply = model.script[turn](body) if turn < len(model.script) else {"error": "script ended"}
                data = json.dumps(reply).encode()
                self.send_response(200 if turn < len(model.script) else 500)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "notes.txt").write_text(NOTES)
    (root / ".env").write_text("API_KEY=hunter2\n")
    return root


def openai_call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def openai_reply(*, calls: list[dict[str, Any]] | None = None, text: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}]}


def anthropic_reply(*blocks: dict[str, Any]) -> dict[str, Any]:
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {"id": "msg", "type": "message", "role": "assistant", "content": list(blocks), "stop_reason": stop}


def use(block_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": args}


# Strict mode: every property is given, optional ones as null (the example turns them back).
READ_NOTES = {"filePath": "notes.txt", "offset": None, "limit": None}
READ_ENV = {"filePath": ".env", "offset": None, "limit": None}
COUNT = {"command": "wc -l < notes.txt", "description": "Counts lines", "timeout": None, "workdir": None}

SCRIPTS: dict[str, list[Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "openai": [
        lambda _: openai_reply(calls=[openai_call("c1", "read", READ_NOTES), openai_call("c2", "read", READ_ENV)]),
        lambda _: openai_reply(calls=[openai_call("c3", "bash", COUNT)]),
        lambda _: openai_reply(text="notes.txt has 3 lines; .env was off limits."),
    ],
    "anthropic": [
        lambda _: anthropic_reply({"type": "text", "text": "Reading."}, use("c1", "read", {"filePath": "notes.txt"}),
                                  use("c2", "read", {"filePath": ".env"})),
        lambda _: anthropic_reply(use("c3", "bash", {"command": "wc -l < notes.txt", "description": "Counts"})),
        lambda _: anthropic_reply({"type": "text", "text": "notes.txt has 3 lines; .env was off limits."}),
    ],
}


@pytest.fixture(params=["openai", "anthropic"])
def model(request: pytest.FixtureRequest) -> Iterator[tuple[str, FakeModel]]:
    fake = FakeModel(SCRIPTS[request.param])
    fake.thread.start()
    yield request.param, fake
    fake.server.shutdown()
    fake.server.server_close()


def tool_results(api: str, body: dict[str, Any]) -> dict[str, str]:
    """call id -> the text the model is given back, from a request's last messages."""
    if api == "openai":
        return {m["tool_call_id"]: m["content"] for m in body["messages"] if m.get("role") == "tool"}
    found: dict[str, str] = {}
    for message in body["messages"]:
        if message["role"] == "user" and isinstance(message["content"], list):
            for block in message["content"]:
                content = block["content"]
                found[block["tool_use_id"]] = content if isinstance(content, str) else content[0]["text"]
    return found


async def test_the_example_loop_against_a_scripted_model(
    plane: Plane, model: tuple[str, FakeModel], workspace: Path,
) -> None:
    api, fake = model
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "AGENT_"))} | {
        "CONTROLPLANE_TARGET": plane.plane.address, "CONTROLPLANE_TOKEN": plane.token,
        "AGENT_API": api, "AGENT_BASE_URL": fake.url + ("/v1" if api == "openai" else ""),
        "AGENT_API_KEY": KEY, "AGENT_MODEL": "scripted-model", "AGENT_WORKSPACE": str(workspace),
        "PYTHONPATH": str(REPO),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "examples" / "agent_loop.py"), "What do the notes say?", env=env, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    assert out.decode() == "notes.txt has 3 lines; .env was off limits.\n"

    assert len(fake.requests) == 3
    path, headers, first = fake.requests[0]
    if api == "openai":
        assert path == "/v1/chat/completions"
        assert headers["authorization"] == f"Bearer {KEY}"
        tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
        assert tools["read"]["strict"] is True
        assert tools["read"]["parameters"]["required"] == ["filePath", "offset", "limit"]
    else:
        assert path == "/v1/messages"
        assert headers["x-api-key"] == KEY
        assert headers["anthropic-version"] == "2023-06-01"
        tools = {t["name"]: t for t in first["tools"]}
        assert tools["read"]["input_schema"]["required"] == ["filePath"]
    assert {"read", "bash"} <= set(tools)
    assert first["model"] == "scripted-model"

    after_reads = tool_results(api, fake.requests[1][2])
    assert "alpha" in after_reads["c1"]
    assert "gamma" in after_reads["c1"]
    assert "off limits" in after_reads["c2"]
    assert "hunter2" not in json.dumps(fake.requests[1][2])  # the secret never reached the model
    after_bash = tool_results(api, fake.requests[2][2])
    assert after_bash["c3"].strip() == "3"
    stderr = err.decode()
    assert "[permission] read ['" in stderr
    assert "rejected (secrets)" in stderr
    assert "3\n" in stderr  # bash's live output, printed from on_event as it streamed
    assert await plane.client.list_sessions() == []  # the example deleted its session
