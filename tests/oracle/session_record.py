"""Records a case through a real upstream session (`opencode run`), for answers its debug command gets wrong.

Upstream's `debug agent --tool` checks permissions with a shortcut of its own: a denied call there lists the
whole ruleset, in the order the config code built each rule. A session's ask (what a model reads) parses the
ruleset with its rule schema and lists only the rules whose permission matches the request. So denied calls
are recorded here: a scripted model on a loopback port (an OpenAI-compatible chat endpoint, one of upstream's
bundled providers) asks for the case's tool call once, and the text upstream sends back to it as the tool's
result is the recorded answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.oracle.cases import Case

PROVIDER = "oracle"
GPT_MODEL = "gpt-5-oracle"
"""A `gpt-` model id: upstream offers `apply_patch` (instead of `edit` and `write`) to those only."""
MODEL = "oracle-model"
DENIED_PREFIX = "The user has specified a rule which prevents you from using this specific tool call."


class ScriptedModel:
    """A chat-completions endpoint that asks for one tool call, then ends the turn, keeping what it was told."""

    def __init__(self, tool: str, params: dict[str, Any]) -> None:
        self.tool, self.params = tool, params
        self.tool_results: list[str] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                chunks = model.answer(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages", [])
        told = [m for m in messages if m.get("role") == "tool"]
        for message in told:
            content = message.get("content")
            self.tool_results.append(content if isinstance(content, str) else json.dumps(content))
        offered = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        if told or self.tool not in offered:  # the turn's end, or a side request (a title)
            return [_chunk({"role": "assistant", "content": "done"}), _chunk({}, "stop")]
        call = {"index": 0, "id": "call_oracle", "type": "function",
                "function": {"name": self.tool, "arguments": json.dumps(self.params)}}
        return [_chunk({"role": "assistant", "content": None, "tool_calls": [call]}), _chunk({}, "tool_calls")]

    def __enter__(self) -> ScriptedModel:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def model_for(case: Case) -> str:
    return GPT_MODEL if case.tool == "apply_patch" else MODEL


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-oracle", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def provider_config(url: str, model: str) -> dict[str, Any]:
    return {
        "model": f"{PROVIDER}/{model}",
        "provider": {PROVIDER: {"npm": "@ai-sdk/openai-compatible", "name": "Oracle",
                                "options": {"baseURL": url, "apiKey": "none"},
                                "models": {model: {"name": "Oracle", "tool_call": True}}}},
    }


async def run_session(binary: Path, case: Case, workspace: Path, env: dict[str, str], timeout_s: float) -> str:
    """The text upstream returned to the model for the case's call (its error text when denied)."""
    with ScriptedModel(case.tool, case.params) as model:
        # The provider comes from the environment's config, so the case's own opencode.json stays as written.
        name = model_for(case)
        run_env = {**env, "OPENCODE_CONFIG_CONTENT": json.dumps(provider_config(model.url, name))}
        proc = await asyncio.create_subprocess_exec(
            str(binary), "run", "--agent", case.agent, "--model", f"{PROVIDER}/{name}", "go",
            cwd=workspace, env=run_env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if not model.tool_results:
            said = (err + out).decode(errors="replace")[-2000:]
            raise RuntimeError(f"{case.name}: upstream sent no tool result\n{said}")
        return denied_message(model.tool_results[0])


def denied_message(told: str) -> str:
    """The denied error's message, from what v1.2.27 told the model.

    v1.2.27 hands the model the error's `toString()`, which for its effect-based error class is
    `PermissionDeniedError({"ruleset":[...],"_tag":...})`, not the message (an upstream slip; the platform
    sends the message). The message getter is `prefix + " Here are some of the relevant rules " +
    JSON.stringify(ruleset)`: built here from the same ruleset, written as JSON.stringify writes it.
    """
    tag = "PermissionDeniedError("
    if not told.startswith(tag):
        return told.removeprefix("Error: ")
    ruleset = json.loads(told[len(tag):-1])["ruleset"]
    listed = json.dumps(ruleset, separators=(",", ":"), ensure_ascii=False)
    return f"{DENIED_PREFIX} Here are some of the relevant rules {listed}"


def session_home(root: Path, case: Case) -> tuple[Path, Path]:
    """(workspace, home) of a session case: the home sits at `tmp/home` beside the workspace, so a path from
    the workspace to the home reads as it does in a sandbox (`/workspace` and `/tmp/home`)."""
    base = root / "session" / case.name
    home = base / "tmp" / "home"
    home.mkdir(parents=True, exist_ok=True)
    return base / "workspace", home


def environment(home: Path, path: str) -> dict[str, str]:
    return {
        "PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
        "USER": "tool", "SHELL": "/bin/bash", "TMPDIR": "/tmp",
        "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
        "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
    }


def wants_session(debug_error: str | None) -> bool:
    """Whether the debug command's answer must be taken again through a session."""
    return debug_error is not None and debug_error.startswith(DENIED_PREFIX)
