"""A local control plane to fuzz, and the invariants every fuzzed call must keep.

Every call gets a deadline (a hang fails as DEADLINE_EXCEEDED); a status outside CLEAR is a crash
(UNKNOWN, INTERNAL) or a broken channel; tool calls end with exactly one result or error; sessions,
the workspace tree and a directory outside it are the same before and after a refused call.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import queue
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.v1 import tool_pb2, tool_pb2_grpc
from tests.archives import tar_of
from tests.planes import short_tmp

MESSAGE_CAP_MB = 4
ARCHIVE_ENTRIES_CAP = 2000
"""limits.max_archive_entries of the fuzzed plane, so an archive past it stays small."""
CALL_TIMEOUT_S = 20.0
CLEAR = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
}
"""Statuses that are an answer about the request; anything else is a crash, a hang or a lost server."""
SECRET = "ocsb-fuzz-secret-7f3a9c"
WORKSPACE_FILES: dict[str, str | bytes] = {
    "README.md": "# fuzz\nhello\n",
    "src/app.py": "def main() -> int:\n    return 0\n",
    "notes/todo.txt": "one\ntwo\nthree\n",
}
TENANTS = [{"name": "fuzz", "token": "token-fuzz"}, {"name": "other", "token": "token-other"}]


@dataclass
class FuzzPlane:
    plane: app.ControlPlane
    client: AsyncClient
    other: AsyncClient
    live: str
    """A READY session of the fuzzing tenant, with WORKSPACE_FILES."""
    foreign: str
    """Another tenant's READY session."""
    deleted: str
    workspace: Path
    outside: Path
    """A directory next to nothing the plane owns, holding SECRET: no call may change or reveal it."""
    sync_channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...] = (("authorization", "Bearer token-fuzz"),)
    ids: list[str] = field(default_factory=list)

    def id_pool(self) -> list[str]:
        return [self.live, self.foreign, self.deleted, "ses_" + "0" * 24, "", "../" + self.live, self.live + "\x00"]


def tree(root: Path) -> dict[str, str]:
    """Path -> kind and content hash, symlinks not followed."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return out


T = TypeVar("T")


async def run_given(
    values: st.SearchStrategy[T], check: Callable[[T], Awaitable[None]], max_examples: int | None = None
) -> None:
    """Hypothesis drives `check` from a worker thread (it runs sync tests only); each example runs on this
    loop, where the plane lives, so shrinking works as usual. `max_examples` caps the profile's count."""
    loop = asyncio.get_running_loop()

    @given(values)
    def example(value: T) -> None:
        asyncio.run_coroutine_threadsafe(_coroutine(check, value), loop).result(timeout=4 * CALL_TIMEOUT_S)

    if max_examples is not None:
        profile = settings.get_current_profile_name()
        example = settings(max_examples=min(max_examples, settings.get_profile(profile).max_examples))(example)
    await asyncio.to_thread(example)


async def _coroutine(check: Callable[[T], Awaitable[None]], value: T) -> None:
    await check(value)


@dataclass(frozen=True)
class Snapshot:
    sessions: list[tuple[str, Any]]
    workspace: dict[str, str]
    outside: dict[str, str]
    sandboxes: list[str]
    """The plane's per-sandbox dirs: one more is a leaked sandbox."""


async def snapshot(fp: FuzzPlane) -> Snapshot:
    sessions = sorted((s.id, s.state) for s in await fp.client.list_sessions(include_deleted=True))
    dirs = sorted(p.name for p in (fp.plane.settings.data_dir / "sandboxes").iterdir())
    return Snapshot(sessions, tree(fp.workspace), tree(fp.outside), dirs)


@asynccontextmanager
async def fuzz_plane() -> AsyncIterator[FuzzPlane]:
    data_dir = short_tmp()
    outside = Path(tempfile.mkdtemp(prefix="ocsbfuzz-outside-", dir="/tmp"))
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "sub").mkdir()
    settings = load_settings(
        None, data_dir=data_dir, instance="fz-" + os.urandom(4).hex(), provider={"type": "local"},
        server={"listen": "127.0.0.1:0", "max_message_mb": MESSAGE_CAP_MB}, tenants=TENANTS,
        limits={"max_archive_entries": ARCHIVE_ENTRIES_CAP},
    )
    plane = await app.start(settings)
    client = AsyncClient(plane.address, "token-fuzz")
    other = AsyncClient(plane.address, "token-other")
    sync_channel = grpc.insecure_channel(plane.address)
    try:
        live = await client.create_session(workspace_archive=tar_of(WORKSPACE_FILES))
        foreign = await other.create_session()
        deleted = await client.create_session()
        await client.delete_session(deleted.id)
        workspace = data_dir / "sandboxes" / live.sandbox_id / "workspace"
        assert (workspace / "README.md").is_file()
        yield FuzzPlane(plane, client, other, live.id, foreign.id, deleted.id, workspace, outside, sync_channel)
    finally:
        sync_channel.close()
        for c in (client, other):
            for s in await c.list_sessions():
                await c.delete_session(s.id)
            await c.close()
        await app.stop(plane)
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)


@dataclass
class CallOutcome:
    code: grpc.StatusCode
    details: str
    events: list[tool_pb2.ToolEvent]

    def terminal(self) -> list[tool_pb2.ToolEvent]:
        return [e for e in self.events if e.WhichOneof("event") in ("result", "error")]

    def text(self) -> str:
        """Everything the caller was shown."""
        return "\n".join([self.details, *(str(e) for e in self.events)])


async def drive_tool_call(
    fp: FuzzPlane, messages: list[tool_pb2.ExecuteToolRequest], timeout_s: float = CALL_TIMEOUT_S
) -> CallOutcome:
    """Sends `messages`, then answers like a careful client: rejects every permission request, aborts on a
    question or subtask, half-closes once the call has ended.

    Streams go through grpc's blocking client in a thread: the asyncio client, still writing requests
    when the server has already answered with an error, sometimes reports its own INTERNAL ("Internal
    error from Core") instead of the server's status."""
    return await asyncio.to_thread(_drive, fp, messages, timeout_s)


def _drive(fp: FuzzPlane, messages: list[tool_pb2.ExecuteToolRequest], timeout_s: float) -> CallOutcome:
    outbox: queue.Queue[tool_pb2.ExecuteToolRequest | None] = queue.Queue()
    for message in messages:
        outbox.put(message)
    if not messages:
        outbox.put(None)  # a client with nothing to say half-closes

    def requests() -> Iterator[tool_pb2.ExecuteToolRequest]:
        while (item := outbox.get()) is not None:
            yield item

    stub = tool_pb2_grpc.ToolServiceStub(fp.sync_channel)
    events: list[tool_pb2.ToolEvent] = []
    try:
        for event in stub.ExecuteTool(requests(), metadata=fp.metadata, timeout=timeout_s):
            events.append(event)
            kind = event.WhichOneof("event")
            if kind == "permission_request":
                reply = tool_pb2.PermissionReply(request_id=event.permission_request.id,
                                                 reply=tool_pb2.PermissionReply.REJECT)
                outbox.put(tool_pb2.ExecuteToolRequest(permission_reply=reply))
            elif kind in ("question", "subtask"):
                outbox.put(tool_pb2.ExecuteToolRequest(abort=tool_pb2.AbortCall(reason="fuzz")))
            elif kind in ("result", "error"):
                outbox.put(None)
        return CallOutcome(grpc.StatusCode.OK, "", events)
    except grpc.RpcError as exc:
        return CallOutcome(exc.code(), exc.details() or "", events)
    finally:
        outbox.put(None)


def assert_clear(outcome: CallOutcome) -> None:
    assert outcome.code in CLEAR, f"{outcome.code.name}: {outcome.details}"
    if outcome.code != grpc.StatusCode.OK:
        assert outcome.details.strip(), f"{outcome.code.name} without a message"
    elif outcome.events:
        terminal = outcome.terminal()
        assert len(terminal) == 1, outcome.events
        assert terminal[0] is outcome.events[-1]
        if terminal[0].WhichOneof("event") == "error":
            assert terminal[0].error.message.strip()
    assert SECRET not in outcome.text(), "a call revealed the file outside the workspace"


def tool_call(session_id: str, tool: str, args_json: str, agent: str = "") -> tool_pb2.ExecuteToolRequest:
    return tool_pb2.ExecuteToolRequest(
        call=tool_pb2.ToolCall(session_id=session_id, tool=tool, args_json=args_json, agent=agent)
    )
