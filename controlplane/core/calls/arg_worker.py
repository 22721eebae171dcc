"""The heaviest work on large tool-call arguments, done in a worker process: parsing, the doom-loop text,
validation against a built-in tool's parameters, and indented JSON text.

A worker thread frees the event loop but not the interpreter. An 8 MiB todo list costs about 0.2 s to parse,
0.4 s to stringify and 1.1 s to validate, all holding the GIL in turns with the loop (json.loads in one
stretch), so one tenant sending such calls without pause put another tenant's `bash echo` p99 at 5-14x its
p99 alone in the fairness bench, with one thread per tenant. In a process of its own that work takes none of
the control plane's interpreter. What crosses the pipe is pickled in pieces of PIECE list items, so that the
plane's own share (packing and unpacking) holds the GIL about a millisecond at a time, never for the whole
object.

The worker runs only the jobs named in JOBS, on data; a job that fails in it, or a worker that died, makes
the caller fall back to doing the work in a thread (`None` answers), so the worker is never needed for a
call to succeed.

    python -m controlplane.core.calls.arg_worker      (started by the control plane; frames on stdin/stdout)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import pickle
import sys
import weakref
from collections.abc import Callable
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

PIECE = 512
"""List items per pickled piece (512 small todo items: about 0.4 ms to pickle or unpickle)."""
HEADER = 8

Packed = tuple[str, Any]


def pack(value: Any) -> Packed:
    """`value` as pickled pieces: an object's values and long lists one piece per PIECE items."""
    if type(value) is dict:
        return "dict", [(key, _pack_one(item)) for key, item in value.items()]
    return _pack_one(value)


def _pack_one(value: Any) -> Packed:
    if type(value) is list and len(value) > PIECE:
        return "list", [pickle.dumps(value[i:i + PIECE], pickle.HIGHEST_PROTOCOL) for i in range(0, len(value), PIECE)]
    return "one", pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def unpack(packed: Packed) -> Any:
    kind, body = packed
    if kind == "dict":
        return {key: unpack(item) for key, item in body}
    if kind == "list":
        items: list[Any] = []
        for piece in body:
            items.extend(pickle.loads(piece))
        return items
    return pickle.loads(body)


def model_ref(model: type) -> str:
    """`module:qualname` of a parameters model the worker can import, or "" (a custom tool's own model)."""
    module = sys.modules.get(model.__module__)
    found: Any = module
    for part in model.__qualname__.split("."):
        found = getattr(found, part, None)
    return f"{model.__module__}:{model.__qualname__}" if found is model else ""


# -- the worker's side --------------------------------------------------------------------------------------


def _prepare(args_json: str) -> tuple[Any, ...]:
    """The parsed arguments and their doom-loop text; ("bad",) when they are not a JSON object (the caller's
    own path repairs that as upstream does)."""
    from opencode_semantics.javascript import json_stringify

    try:
        args = json.loads(args_json) if args_json.strip() else {}
    except json.JSONDecodeError:
        return ("bad",)
    if not isinstance(args, dict):
        return ("bad",)
    return "ok", pack(args), json_stringify(args)


def _validate(tool_id: str, ref: str, packed: Packed) -> tuple[Any, ...]:
    from controlplane.core.calls.tool import ToolError
    from controlplane.core.definitions.validation import validate

    module, _, qualname = ref.partition(":")
    model: Any = importlib.import_module(module)
    for part in qualname.split("."):
        model = getattr(model, part)
    try:
        return "ok", pack(validate(tool_id, model, unpack(packed)))
    except ToolError as exc:
        return "tool error", str(exc)


def _stringify(packed: Packed, indent: int | None) -> tuple[Any, ...]:
    from opencode_semantics.javascript import json_stringify

    return "ok", json_stringify(unpack(packed), indent=indent)


JOBS: dict[str, Callable[..., tuple[Any, ...]]] = {"prepare": _prepare, "validate": _validate, "stringify": _stringify}


def _read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(HEADER)
    if len(head) < HEADER:
        return None
    return stream.read(int.from_bytes(head, "big"))


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    while (frame := _read_frame(source)) is not None:
        job, args = pickle.loads(frame)
        try:
            answer = JOBS[job](*args)
        except Exception as exc:  # the caller does the work itself; the worker keeps serving
            answer = ("failed", f"{type(exc).__name__}: {exc}")
        blob = pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)
        sink.write(len(blob).to_bytes(HEADER, "big") + blob)
        sink.flush()


# -- the control plane's side --------------------------------------------------------------------------------


class ArgWorker:
    """One worker process, started on first use, jobs one at a time (each tenant has at most one large call
    running: arguments.TenantLanes), restarted after it dies."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def _started(self) -> asyncio.subprocess.Process:
        process = self._process
        if process is None or process.returncode is not None:
            process = self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "controlplane.core.calls.arg_worker",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )
        return process

    async def run(self, job: str, *args: Any) -> tuple[Any, ...] | None:
        """The job's answer, or None when the worker could not do it (the caller then does it itself)."""
        request = pickle.dumps((job, args), pickle.HIGHEST_PROTOCOL)  # args are packed already: bytes
        async with self._lock:
            try:
                process = await self._started()
                assert process.stdin is not None
                assert process.stdout is not None
                process.stdin.write(len(request).to_bytes(HEADER, "big") + request)
                await process.stdin.drain()
                size = int.from_bytes(await process.stdout.readexactly(HEADER), "big")
                answer: tuple[Any, ...] = pickle.loads(await process.stdout.readexactly(size))
            except (OSError, asyncio.IncompleteReadError) as exc:
                log.warning("the argument worker failed (%s); doing the work in a thread", exc)
                self._stop()
                return None
            except BaseException:  # cancelled mid-frame: the pipe's framing is lost with it
                self._stop()
                raise
        if answer[0] == "failed":
            log.warning("the argument worker's %s failed: %s", job, answer[1])
            return None
        return answer

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def close(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            assert process.stdin is not None
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                process.kill()
                await process.wait()


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ArgWorker] = weakref.WeakKeyDictionary()


def shared() -> ArgWorker:
    """The running loop's worker: one process per control plane, whichever tool or executor asks."""
    loop = asyncio.get_running_loop()
    worker = _shared.get(loop)
    if worker is None:
        worker = _shared[loop] = ArgWorker()
    return worker


async def close_shared() -> None:
    worker = _shared.pop(asyncio.get_running_loop(), None)
    if worker is not None:
        await worker.close()


async def stringified(value: Any, indent: int | None = None) -> str | None:
    """`json_stringify(value, indent)` made in the worker (None: it could not; the caller makes it)."""
    packed = await asyncio.to_thread(pack, value)
    answer = await shared().run("stringify", packed, indent)
    return None if answer is None else str(answer[1])


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
