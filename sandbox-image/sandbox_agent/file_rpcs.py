"""The agent's side of the files API: WriteFile, ReadFile, ListFiles (and Upload's/Download's files-API options).

Each call runs `sandbox_agent.fileops` as the tool user (server.run_helper) and relays its stdin/stdout in
chunks, so neither side holds a whole file: the helper's output pauses when the stream is slow
(process.py's output buffer), and the content a caller sends waits on the helper's stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sandbox.v1 import agent_pb2
from sandbox_agent.fileops import frame
from sandbox_agent.helper_temps import Announced, Helper, collect, stop_and_clean
from sandbox_agent.process import Chunk, Execution, Exit
from sandbox_agent.rpc_status import Code, RequestsLostError, code_named


async def _refuse(context: Any, stderr: bytes, exit_: Exit) -> None:
    """Aborts the RPC with the status the helper named on its last stderr line."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    status, _, message = (lines[-1] if lines else "").partition(" ")
    code = code_named(status)
    if code is None:
        code, message = Code.INTERNAL, (lines[-1] if lines else f"file helper failed ({exit_.exit_code})")
    await context.abort(code, message)


class FileRpcs:
    def __init__(self, workspace: str, max_write_bytes: int, helper: Helper,
                 changed: Callable[[str, float], None], running: set[Execution],
                 background: Callable[[asyncio.Task[Any]], None]) -> None:
        self._workspace = workspace
        self._max_write_bytes = max_write_bytes
        self._helper = helper
        self._changed = changed
        self._running = running
        self._background = background

    def caller_changed(self, rel: str) -> None:
        """Voids the sessions' reads of `rel` (relative to the workspace), by both of its spellings."""
        now = time.time()
        self._changed(os.path.join(self._workspace, rel) if rel else self._workspace, now)
        self._changed(os.path.join(os.path.realpath(self._workspace), rel), now)

    def caller_changed_under(self, real_dir: str) -> None:
        rel = os.path.relpath(real_dir, os.path.realpath(self._workspace))
        self.caller_changed("" if rel == "." else rel)

    async def _start(self, argv: list[str], stdin: bool = False) -> Execution:
        helper = await self._helper(["sandbox_agent.fileops", *argv], stdin)
        self._running.add(helper)
        return helper

    def _done(self, helper: Execution) -> None:
        self._running.discard(helper)
        if not helper.finished:
            # The caller went away (or its token was refused): the helper is stopped; a write's helper then
            # removes its unfinished file (fileops.py).
            self._background(helper.stop(reason="file call cancelled"))

    async def write(self, requests: AsyncIterator[agent_pb2.WriteFileRequest], context: Any) -> agent_pb2.FileEntry:
        iterator = aiter(requests)
        first = await anext(iterator, None)
        if first is None or not first.path:
            await context.abort(Code.INVALID_ARGUMENT, "the first WriteFile message must name the file")
            raise AssertionError("unreachable")
        mode = format(first.mode, "o") if first.HasField("mode") else "-"
        helper = await self._start(
            ["write", self._workspace, first.path, mode, "1" if first.parents else "0", str(self._max_write_bytes)],
            stdin=True,
        )
        announced = Announced(self._workspace)
        collected = False
        try:
            feeding = _feed(helper, first.chunk, (r.chunk async for r in iterator))
            out, err, exit_ = await _collect_while(helper, feeding, announced)
            collected = True
        finally:
            self._running.discard(helper)
            if not collected:
                # The caller went away: the helper is stopped, and what it could not remove is removed for it.
                cleaning = stop_and_clean(helper, announced, "file call cancelled", self._helper)
                self._background(asyncio.ensure_future(cleaning))
        if exit_.exit_code != 0:
            await announced.remove_left(self._helper)
            await _refuse(context, err, exit_)
        written = agent_pb2.FileEntry(**json.loads(out))
        self.caller_changed(written.path)
        return written

    async def read(self, request: agent_pb2.ReadFileRequest, context: Any) -> AsyncIterator[agent_pb2.ReadFileResponse]:
        async for chunk in self._streamed(["read", self._workspace, request.path], context):
            yield agent_pb2.ReadFileResponse(chunk=chunk)

    async def listing(self, request: agent_pb2.ListFilesRequest, context: Any) -> agent_pb2.ListFilesResponse:
        helper = await self._start(
            ["list", self._workspace, request.path, "1" if request.recursive else "0", str(request.limit)]
        )
        try:
            out, err, exit_ = await collect(helper, Announced(self._workspace))
        finally:
            self._done(helper)
        if exit_.exit_code != 0:
            await _refuse(context, err, exit_)
        found = json.loads(out)
        return agent_pb2.ListFilesResponse(
            entries=[agent_pb2.FileEntry(**e) for e in found["entries"]], truncated=found["truncated"],
            target=agent_pb2.FileEntry(**found["target"]),
        )

    async def pack(self, paths: list[str], context: Any) -> AsyncIterator[agent_pb2.DownloadWorkspaceResponse]:
        async for chunk in self._streamed(["pack", self._workspace, *paths], context):
            yield agent_pb2.DownloadWorkspaceResponse(chunk=chunk)

    async def _streamed(self, argv: list[str], context: Any) -> AsyncIterator[bytes]:
        """The helper's stdout as it comes; its stderr becomes the refusal's text if it fails."""
        helper = await self._start(argv)
        err = bytearray()
        try:
            async for item in helper.events():
                if isinstance(item, Chunk) and item.stream == "stdout":
                    yield item.data
                elif isinstance(item, Chunk):
                    err += item.data
                elif item.exit_code != 0:
                    await _refuse(context, bytes(err), item)
        finally:
            self._done(helper)


async def _feed(helper: Execution, first: bytes, rest: AsyncIterator[bytes]) -> None:
    """The caller's content, framed, then the end mark: only a stream that really ended gets it (fileops.frames)."""
    if first:
        await helper.write_stdin(frame(first))
    async for chunk in rest:
        if chunk:
            await helper.write_stdin(frame(chunk))
    await helper.write_stdin(frame(b""))
    helper.close_stdin()


async def _collect_while(helper: Execution, feeding: Awaitable[None], stdout: Announced) -> tuple[bytes, bytes, Exit]:
    """The helper's output and exit while `feeding` writes its stdin. A helper that refused early (a bad path)
    still has the caller's stream read to its end (writes to it are dropped), as UploadWorkspace does: a caller
    still writing when the call ends would see its own write fail instead of the refusal."""
    feed = asyncio.ensure_future(feeding)
    try:
        result = await collect(helper, stdout)
        await feed
        return result
    finally:
        if not feed.done():
            feed.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError, RequestsLostError):
                await feed
