"""The heaviest work on large tool-call arguments, done in a worker process: parsing, the doom-loop text,
validation against a built-in tool's parameters, and indented JSON text.

A worker thread frees the event loop but not the interpreter. An 8 MiB todo list costs about 0.2 s to parse,
0.4 s to stringify and 1.1 s to validate, all holding the GIL in turns with the loop (json.loads in one
stretch), so one tenant sending such calls without pause put another tenant's `bash echo` p99 at 5-14x its
p99 alone in the fairness bench, with one thread per tenant. In a process of its own that work takes none of
the control plane's interpreter. What crosses the pipe is pickled in pieces of PIECE list items, so that the
plane's own share (packing and unpacking) holds the GIL about a millisecond at a time, never for the whole
object.

The worker runs only the jobs named in JOBS, on data, one at a time, taking turns between tenants (a tenant
has at most one job waiting for it, so another tenant's job waits behind at most one job of each). A job
that fails in it for an ordinary reason (a bug) makes the caller do the work in a thread (`None` answers).
A job that runs out of the worker's memory (RLIMIT_AS, limits.arg_worker_memory_mb), or a worker that dies
in the middle of a job (the OOM killer, a crash), fails that one call with ArgWorkerError and nothing
else: doing hostile work again in the control plane's own memory is exactly what the worker is there to
avoid, and the next job starts a new worker.

    python -m controlplane.core.calls.arg_worker [--memory-mb N]   (started by the control plane; frames on
                                                                     stdin/stdout)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import json
import logging
import os
import pickle
import sys
import weakref
from collections.abc import Callable
from typing import Any, BinaryIO

from controlplane.core.calls.tool import ToolError

log = logging.getLogger(__name__)

PIECE = 512
"""List items per pickled piece (512 small todo items: about 0.4 ms to pickle or unpickle)."""
HEADER = 8
DEFAULT_MEMORY_MB = 512
"""The worker's address space (RLIMIT_AS). An 8 MiB todo list (the default limits.max_args_bytes) peaks at
about 220 MiB of it: parsed, validated and stringified with an indent."""

NICE = 10
"""The worker's niceness over the control plane's."""

current_tenant: contextvars.ContextVar[str] = contextvars.ContextVar("arg_worker_tenant", default="")
"""Whose call the running task serves (the executor sets it): the worker's turns are taken per tenant, also
for the work a tool asks for itself (todowrite's result text), which does not know its tenant."""


class ArgWorkerError(ToolError):
    """The worker ran out of memory or died while it had this call's arguments: the call fails, no other."""

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
    """The parsed arguments and their doom-loop fingerprint; ("bad",) when they are not a JSON object (the
    caller's own path repairs that as upstream does)."""
    from controlplane.core.calls.doom_loop import fingerprint
    from opencode_semantics.javascript import json_stringify

    try:
        args = json.loads(args_json) if args_json.strip() else {}
    except json.JSONDecodeError:
        return ("bad",)
    if not isinstance(args, dict):
        return ("bad",)
    return "ok", pack(args), fingerprint(json_stringify(args))


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
        except MemoryError:  # what the job held is garbage now: the worker keeps serving, the call fails
            answer = ("memory", "")
        except Exception as exc:  # the caller does the work itself; the worker keeps serving
            answer = ("failed", f"{type(exc).__name__}: {exc}")
        blob = pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)
        sink.write(len(blob).to_bytes(HEADER, "big") + blob)
        sink.flush()


# -- the control plane's side --------------------------------------------------------------------------------


class _Turn:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class ArgWorker:
    """One worker process, started on first use, jobs one at a time in turns between tenants, restarted after
    it dies."""

    def __init__(self, memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.memory_mb = memory_mb
        """RLIMIT_AS of the next worker started (0: none)."""
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        """FIFO: with one job per tenant waiting for it (_turns), the tenants take turns."""
        self._turns: dict[str, _Turn] = {}

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    async def _started(self) -> asyncio.subprocess.Process:
        process = self._process
        if process is None or process.returncode is not None:
            limit = ["--memory-mb", str(self.memory_mb)] if self.memory_mb > 0 else []
            process = self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "controlplane.core.calls.arg_worker", *limit,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )
        return process

    async def run(self, job: str, *args: Any) -> tuple[Any, ...] | None:
        """The job's answer, or None when the worker could not do it for an ordinary reason (the caller then
        does it itself); ArgWorkerError when it ran out of memory or died with the job."""
        tenant = current_tenant.get()
        turn = self._turns.get(tenant)
        if turn is None:
            turn = self._turns[tenant] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                answer = await self._run(job, args)
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[tenant]  # no job of this tenant waits: nothing kept per tenant
        if answer[0] == "memory":
            raise ArgWorkerError(
                f"the arguments needed more memory than the argument worker may use "
                f"({self.memory_mb} MiB, limits.arg_worker_memory_mb); send smaller arguments"
            )
        if answer[0] == "failed":
            log.warning("the argument worker's %s failed: %s", job, answer[1])
            return None
        return answer

    async def _run(self, job: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        request = pickle.dumps((job, args), pickle.HIGHEST_PROTOCOL)  # args are packed already: bytes
        async with self._lock:
            process = await self._started()
            try:
                assert process.stdin is not None
                assert process.stdout is not None
                process.stdin.write(len(request).to_bytes(HEADER, "big") + request)
                await process.stdin.drain()
                size = int.from_bytes(await process.stdout.readexactly(HEADER), "big")
                answer: tuple[Any, ...] = pickle.loads(await process.stdout.readexactly(size))
            except (OSError, asyncio.IncompleteReadError) as exc:
                self._stop()
                status = await _exit_status(process)
                log.warning("the argument worker died during a %s job (%s, %s)", job, status, exc)
                raise ArgWorkerError(
                    f"the argument worker died while it handled this call's arguments ({status}); the call "
                    f"failed, the next one starts a new worker"
                ) from exc
            except BaseException:  # cancelled mid-frame: the pipe's framing is lost with it
                self._stop()
                raise
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


async def _exit_status(process: asyncio.subprocess.Process) -> str:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), 5)
    code = process.returncode
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


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


def main(argv: list[str]) -> None:
    # Below the control plane and the sandboxes' agents in the CPU's scheduling: on a busy host the work of
    # one tenant's huge arguments waits for the other tenants' small calls, not the other way round.
    os.nice(NICE)
    if argv[:1] == ["--memory-mb"]:
        import resource

        limit = int(argv[1]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main(sys.argv[1:])
