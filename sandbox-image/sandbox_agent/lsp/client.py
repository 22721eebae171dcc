"""A small Language Server Protocol client speaking JSON-RPC over a server process's stdin and stdout.

Only what the `lsp` tool needs: the initialize handshake, requests and notifications, keeping one
document per file in sync (didOpen, then didChange with the whole text), the diagnostics the server
publishes, and an orderly shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from sandbox_agent.errors import AgentError
from sandbox_agent.process import Chunk, Execution

INITIALIZE_TIMEOUT_S = 45.0
REQUEST_TIMEOUT_S = 120.0
SHUTDOWN_TIMEOUT_S = 1.0
EXIT_WAIT_S = 1.0
DIAGNOSTICS_TIMEOUT_S = 3.0
DIAGNOSTICS_SETTLE_S = 0.15
"""Servers often publish twice in a row (syntax, then semantics); wait until they have been quiet this long."""
STDERR_TAIL_BYTES = 4096
METHOD_NOT_FOUND = -32601
_HEADER_END = b"\r\n\r\n"


class LspError(AgentError):
    """A request failed: the server answered with an error, did not answer in time, or is gone."""


class LspServerExitedError(LspError):
    """The server process exited (or its pipes broke) before answering."""


class LspProtocolError(LspError):
    """The server wrote something that is not LSP framing or JSON."""


def encode_message(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class FrameDecoder:
    """Splits the server's byte stream into JSON messages (`Content-Length` framing)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer.extend(data)
        messages: list[Any] = []
        while True:
            end = self._buffer.find(_HEADER_END)
            if end < 0:
                return messages
            length = _content_length(bytes(self._buffer[:end]))
            start = end + len(_HEADER_END)
            if len(self._buffer) < start + length:
                return messages
            body = bytes(self._buffer[start:start + length])
            del self._buffer[:start + length]
            try:
                messages.append(json.loads(body.decode("utf-8")))
            except ValueError as exc:
                raise LspProtocolError(f"the language server sent a message that is not JSON: {exc}") from exc


def _content_length(header: bytes) -> int:
    for line in header.decode("ascii", "replace").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value.strip())
            except ValueError:
                break
            if length >= 0:
                return length
    raise LspProtocolError(f"the language server sent a header without a valid Content-Length: {header[:200]!r}")


class LspClient:
    """One running server. Build with `await LspClient.start(...)`; `close()` shuts it down."""

    def __init__(self, execution: Execution, *, name: str, root: str) -> None:
        self.name = name
        self.root = root
        self._execution = execution
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._write_lock = asyncio.Lock()
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0
        self._gone: LspServerExitedError | None = None
        self._documents: dict[str, int] = {}
        """Version of each document sent to the server, by path."""
        self.diagnostics: dict[str, list[Any]] = {}
        """The latest diagnostics the server published, by path."""
        self._published: dict[str, int] = {}
        self._publish_signal = asyncio.Event()
        self._replies: set[asyncio.Task[None]] = set()
        self.capabilities: dict[str, Any] = {}
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, execution: Execution, *, name: str, root: str,
                    initialization_options: dict[str, Any] | None = None) -> LspClient:
        """Wraps a freshly started server process and performs the initialize handshake."""
        client = cls(execution, name=name, root=root)
        try:
            await client._initialize(initialization_options or {})
        except BaseException:
            await client.kill()
            raise
        return client

    @property
    def pid(self) -> int:
        return self._execution.pid

    @property
    def alive(self) -> bool:
        return self._gone is None

    # -- requests and notifications -------------------------------------------------------------

    async def request(self, method: str, params: Any, *, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        if self._gone is not None:
            raise self._gone
        request_id = next(self._ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = answer
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return await asyncio.wait_for(answer, timeout_s)
        except TimeoutError as exc:
            raise LspError(f"{self.name} did not answer {method} within {timeout_s:g}s") from exc
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, method: str, params: Any) -> None:
        if self._gone is not None:
            raise self._gone
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _send(self, message: dict[str, Any]) -> None:
        async with self._write_lock:
            await self._execution.write_stdin(encode_message(message))

    async def _initialize(self, options: dict[str, Any]) -> None:
        root_uri = Path(self.root).as_uri()
        result = await self.request("initialize", {
            "processId": self._execution.pid,
            "rootUri": root_uri,
            "workspaceFolders": [{"name": "workspace", "uri": root_uri}],
            "initializationOptions": options,
            # The capabilities upstream's client declares, so a server answers in the shapes it would
            # give upstream (no hierarchical document symbols, its default hover markup).
            "capabilities": {
                "window": {"workDoneProgress": True},
                "workspace": {"configuration": True, "didChangeWatchedFiles": {"dynamicRegistration": True}},
                "textDocument": {
                    "synchronization": {"didOpen": True, "didChange": True},
                    "publishDiagnostics": {"versionSupport": True},
                },
            },
        }, timeout_s=INITIALIZE_TIMEOUT_S)
        if isinstance(result, dict) and isinstance(result.get("capabilities"), dict):
            self.capabilities = result["capabilities"]
        await self.notify("initialized", {})

    # -- documents and diagnostics --------------------------------------------------------------

    async def sync_document(self, path: str, text: str, language_id: str) -> int:
        """Sends the file's current text: didOpen the first time, a full didChange afterwards."""
        uri = Path(path).as_uri()
        version = self._documents.get(path)
        if version is None:
            version = 0
            await self.notify("textDocument/didOpen", {
                "textDocument": {"uri": uri, "languageId": language_id, "version": version, "text": text},
            })
        else:
            version += 1
            await self.notify("textDocument/didChange", {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"text": text}],
            })
        self._documents[path] = version
        return version

    def publications(self, path: str) -> int:
        """How many times diagnostics were published for `path` so far (a mark for `wait_for_diagnostics`)."""
        return self._published.get(path, 0)

    async def wait_for_diagnostics(self, path: str, since: int, *, timeout_s: float = DIAGNOSTICS_TIMEOUT_S,
                                   settle_s: float = DIAGNOSTICS_SETTLE_S) -> bool:
        """Waits for a publication for `path` after the mark `since`, then for the server to go quiet.

        Returns False when nothing came within `timeout_s` (servers need not publish at all).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen = since
        quiet_until: float | None = None
        while self._gone is None:
            count = self.publications(path)
            if count > seen:
                seen = count
                quiet_until = loop.time() + settle_s
            wake = min(deadline, quiet_until) if quiet_until is not None else deadline
            remaining = wake - loop.time()
            if remaining <= 0:
                break
            self._publish_signal.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._publish_signal.wait(), remaining)
        return seen > since

    # -- the server's side of the conversation --------------------------------------------------

    async def _read(self) -> None:
        reason = "it closed its output"
        try:
            async for item in self._execution.events():
                if not isinstance(item, Chunk):
                    reason = f"it exited with status {item.exit_code}"
                    continue
                if item.stream == "stderr":
                    self._keep_stderr(item.data)
                    continue
                for message in self._decoder.feed(item.data):
                    self._dispatch(message)
        except LspProtocolError as exc:
            reason = str(exc)
            self._execution.stop(reason="protocol error")
        finally:
            self._mark_gone(reason)

    def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                self._reply_later(message["id"], method, message.get("params"))
            elif method == "textDocument/publishDiagnostics":
                self._on_diagnostics(message.get("params"))
            return
        answer = self._pending.get(message.get("id"))  # type: ignore[arg-type]
        if answer is None or answer.done():
            return
        error = message.get("error")
        if error is not None:
            text = error.get("message", error) if isinstance(error, dict) else error
            answer.set_exception(LspError(f"{self.name} answered with an error: {text}"))
        else:
            answer.set_result(message.get("result"))

    def _on_diagnostics(self, params: Any) -> None:
        if not isinstance(params, dict) or not isinstance(params.get("uri"), str):
            return
        path = _uri_path(params["uri"])
        if path is None:
            return
        self.diagnostics[path] = list(params.get("diagnostics") or [])
        self._published[path] = self._published.get(path, 0) + 1
        self._publish_signal.set()

    def _reply_later(self, request_id: Any, method: str, params: Any) -> None:
        task = asyncio.ensure_future(self._reply(request_id, method, params))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _reply(self, request_id: Any, method: str, params: Any) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if method == "workspace/configuration":
            items = params.get("items", []) if isinstance(params, dict) else []
            message["result"] = [None for _ in items]
        elif method == "workspace/workspaceFolders":
            message["result"] = [{"name": "workspace", "uri": Path(self.root).as_uri()}]
        elif method in ("window/workDoneProgress/create", "client/registerCapability",
                        "client/unregisterCapability", "window/showMessageRequest"):
            message["result"] = None
        else:
            message["error"] = {"code": METHOD_NOT_FOUND, "message": f"unhandled method {method}"}
        with contextlib.suppress(LspError):
            if self._gone is None:
                await self._send(message)

    def _keep_stderr(self, data: bytes) -> None:
        self._stderr.append(data)
        self._stderr_size += len(data)
        while self._stderr_size - len(self._stderr[0]) >= STDERR_TAIL_BYTES:
            self._stderr_size -= len(self._stderr.popleft())

    def stderr_tail(self) -> str:
        return b"".join(self._stderr)[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")

    def _mark_gone(self, reason: str) -> None:
        if self._gone is None:
            self._gone = LspServerExitedError(f"{self.name} stopped: {reason}")
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(self._gone)
        self._publish_signal.set()

    # -- shutdown -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Asks the server to shut down and exit; kills its process group if it does not."""
        if self._gone is None:
            with contextlib.suppress(LspError):
                await self.request("shutdown", None, timeout_s=SHUTDOWN_TIMEOUT_S)
                await self.notify("exit", None)
            self._execution.close_stdin()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), EXIT_WAIT_S)
        await self.kill()

    async def kill(self) -> None:
        """Stops the whole process group now and waits until the reader has seen the exit."""
        await self._execution.stop(reason="language server closed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), EXIT_WAIT_S)
        if not self._reader.done():
            self._reader.cancel()
            self._mark_gone("it was stopped")
        for task in list(self._replies):
            task.cancel()


def _uri_path(uri: str) -> str | None:
    parts = urlsplit(uri)
    if parts.scheme != "file":
        return None
    return unquote(parts.path)
