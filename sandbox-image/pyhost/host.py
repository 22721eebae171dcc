"""The Python tool host: imports the project's `.py` tool files once and serves their calls over the
tool host protocol. Run as `python3 /opt/agent/pyhost/host.py` with cwd = the project directory.
"""

from __future__ import annotations

# isort: off
import gc

# No collection while the host's own modules load (they live as long as the host): a few ms of every host start,
# which a session's first listing may wait for. main() turns it back on before any tool file is imported.
gc.disable()
# First of all: the host enters proc_guard's domain and takes its protected identity before anything else loads,
# so that the agent's identity check (verify_server) passes while the rest of the host's imports are still running.
import pyhost_harden  # noqa: F401, E402
# isort: on
import asyncio  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import pyhost_logs  # noqa: E402
from opencode_tool import InvalidArguments, PermissionDenied, Tool, ToolContext  # noqa: E402
from pyhost_children import CHILDREN, kill_all  # noqa: E402
from pyhost_tracing import Recording, unix_ms  # noqa: E402

ABORTED = "Tool execution aborted"
CANCEL_AFTER_S = 0.1
ABORT_GRACE_S = 0.5
"""After this long (the driver's grace) an aborted call still running is abandoned: its children are killed."""
"""How long an aborted async tool may take to notice `ctx.abort` before it is cancelled."""
MAX_LINE = 1 << 30

Message = dict[str, Any]


class Channel:
    """The protocol output: the real stdout, moved aside so that tool output goes to stderr."""

    def __init__(self) -> None:
        self._fd = os.dup(1)
        os.dup2(2, 1)  # print(), sys.stdout and child processes now write to stderr
        sys.stdout = sys.stderr

    def send(self, message: Message) -> None:
        data = memoryview(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        while data:
            data = data[os.write(self._fd, data):]


def log(text: str) -> None:
    print(f"pyhost: {text}", file=sys.stderr, flush=True)


def describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


@dataclass
class LoadedTool:
    id: str
    tool: Tool
    parameters: dict[str, Any]
    origin: str
    init_ms: float


@dataclass
class FileState:
    version: str
    kind: str
    tools: list[LoadedTool] = field(default_factory=list)
    errors: list[Message] = field(default_factory=list)
    notes: list[Message] = field(default_factory=list)
    logs: list[Message] = field(default_factory=list)


def file_version(path: str) -> str:
    try:
        stat = os.stat(path)
    except OSError:
        return ""
    return f"{stat.st_mtime_ns}:{stat.st_size}"


class Registry:
    """The loaded files; a re-load imports again only what changed (mtime or size)."""

    def __init__(self) -> None:
        self._files: dict[str, FileState] = {}
        self._imports = itertools.count(1)
        self.tools: dict[str, LoadedTool] = {}

    def load(self, files: list[Message], recording: Recording | None = None) -> Message:
        states: dict[str, FileState] = {}
        for file in files:
            path, kind = str(file["path"]), str(file.get("kind", "tool"))
            version = file_version(path)
            known = self._files.get(path)
            fresh = known is not None and known.version == version != "" and known.kind == kind
            states[path] = known if fresh and known is not None else self._load_file(path, kind, version, recording)
        self._files = states
        tools: dict[str, LoadedTool] = {}
        errors: list[Message] = []
        notes: list[Message] = []
        logs: list[Message] = []
        for state in states.values():
            logs += state.logs
            errors += state.errors
            notes += state.notes
            for loaded in state.tools:
                if loaded.id in tools:
                    notes.append({"origin": loaded.origin,
                                  "message": f"tool {loaded.id} replaces the one from {tools[loaded.id].origin}"})
                tools[loaded.id] = loaded
        self.tools = tools
        listed = [
            {"id": t.id, "description": t.tool.description, "parameters": t.parameters, "origin": t.origin,
             "source": "CUSTOM", "init_ms": t.init_ms}
            for t in tools.values()
        ]
        return {"type": "loaded", "tools": listed, "load_errors": errors, "hooks": [], "notes": notes, "logs": logs,
                **(recording.field() if recording is not None else {})}

    def _load_file(self, path: str, kind: str, version: str, recording: Recording | None) -> FileState:
        # What the file prints while imported stays with it (pyhost_logs.py).
        scope = pyhost_logs.Scope("", path, sink=[])
        token = pyhost_logs.SCOPE.set(scope)
        try:
            state = self._import_file(path, kind, version, recording)
        finally:
            pyhost_logs.SCOPE.reset(token)
        state.logs = pyhost_logs.finish(scope)
        return state

    def _import_file(self, path: str, kind: str, version: str, recording: Recording | None) -> FileState:
        state = FileState(version, kind)
        if kind != "tool":
            state.errors.append({"origin": path, "message": "the Python host loads tool files only, not plugins"})
            return state
        started = time.perf_counter()
        try:
            module = self._import(path)
        except BaseException as exc:  # SystemExit and friends from a tool file must not end the host
            state.errors.append({"origin": path, "message": f"{type(exc).__name__}: {exc}"})
            if recording is not None:
                trace_inits(recording, path, state, started)
            return state
        imported = time.perf_counter() - started  # shared by every tool of the file
        stem = os.path.splitext(os.path.basename(path))[0]
        declared = getattr(module, "__all__", None)
        names = sorted(declared if isinstance(declared, list | tuple) else
                       (name for name in vars(module) if not name.startswith("_")))
        for name in names:
            value = getattr(module, name, None)
            if not isinstance(value, Tool):
                if declared is not None:
                    state.notes.append({"origin": path, "message": f"{name} is not a tool definition; skipped"})
                continue
            tool_id = stem if name == "default" else f"{stem}_{name}"
            converting = time.perf_counter()
            try:
                parameters = value.parameters()
            except Exception as exc:
                state.errors.append({"origin": path, "message": f"tool {tool_id}: {describe(exc)}"})
                continue
            for keyword in value.unenforced():
                state.notes.append({"origin": path, "message": f"tool {tool_id}: {keyword} is not enforced"})
            init_ms = (imported + time.perf_counter() - converting) * 1000
            state.tools.append(LoadedTool(tool_id, value, parameters, path, round(init_ms, 3)))
        if recording is not None:
            trace_inits(recording, path, state, started, started + imported)
        return state

    def _import(self, path: str) -> Any:
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # sibling modules import as in a script run from that folder
        stem = os.path.splitext(os.path.basename(path))[0]
        name = f"opencode_custom_tool_{next(self._imports)}_{stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # pydantic and dataclasses look their module up here
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


def trace_inits(recording: Recording, path: str, state: FileState, started: float,
                imported: float | None = None) -> None:
    """One `init_tool` span per tool of a freshly loaded file (its import plus its own conversion) and per error."""
    start_ms = unix_ms(started)
    stem = os.path.splitext(os.path.basename(path))[0]
    for loaded in state.tools:
        span = recording.start(f"init_tool {loaded.id}", {
            "gen_ai.tool.name": loaded.id, "sandbox.tool.origin": path, "sandbox.tool.source": "custom",
            "sandbox.init_ms": loaded.init_ms,
        }, start_ms)
        if span is not None and imported is not None:
            span.event("module imported", unix_ms(imported))
        scope = pyhost_logs.SCOPE.get()
        if span is not None and scope is not None and scope.sink:
            # What the file printed while imported (at most the scope's 50 lines), as the Bun host does.
            for line in scope.sink:
                span.event("log", float(line["at"]), {"log.level": line["level"], "log.text": line["text"]})
        if span is not None:
            span.end(start_ms + loaded.init_ms)
    for error in state.errors:
        message = str(error["message"])
        tool_id = message[5:].split(":", 1)[0] if message.startswith("tool ") else stem
        span = recording.start(f"init_tool {tool_id}", {
            "gen_ai.tool.name": tool_id, "sandbox.tool.origin": path, "sandbox.tool.source": "custom",
        }, start_ms)
        if span is not None:
            span.fail(message).end()


@dataclass
class Running:
    task: asyncio.Task[Any]
    abort: asyncio.Event
    is_async: bool
    children: set[int]


def normalise(result: Any) -> Message:
    if isinstance(result, str):
        return {"title": "", "output": result, "metadata": {}, "attachments": []}
    if isinstance(result, dict) and isinstance(result.get("output"), str):
        attachments = [a for a in result.get("attachments") or [] if isinstance(a, dict)]
        return {
            "title": result["title"] if isinstance(result.get("title"), str) else "",
            "output": result["output"],
            "metadata": result["metadata"] if isinstance(result.get("metadata"), dict) else {},
            "attachments": [
                {"mime": str(a.get("mime", "")), "url": str(a.get("url", ""))}
                | ({"filename": a["filename"]} if isinstance(a.get("filename"), str) else {})
                for a in attachments
            ],
        }
    return {"title": "", "output": stringify(result), "metadata": {}, "attachments": []}


def stringify(value: Any) -> str:
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(value)


class Host:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.registry = Registry()
        self.running: dict[str, Running] = {}
        self.asks: dict[str, tuple[str, asyncio.Future[tuple[bool, str]]]] = {}
        self._ask_ids = itertools.count(1)

    def send(self, message: Message) -> None:
        self.channel.send(message)

    async def handle(self, request: Message) -> None:
        request_id = str(request.get("id", ""))
        kind = request.get("type")
        if kind == "call":
            await self.call(request_id, str(request.get("tool")), request.get("args"), request.get("context") or {},
                            Recording(request))
        elif kind == "hook":
            # No Python plugins: every hook leaves its output as it came.
            self.send({"id": request_id, "type": "hook_result", "output": request.get("output") or {}})
        elif kind == "ask_reply":
            self.answer(str(request.get("ask_id")), request.get("allowed") is True, str(request.get("message", "")))
        elif kind == "abort":
            self.abort(str(request.get("call")))
        elif kind == "ping":
            self.send({"id": request_id, "type": "pong"})
        else:
            self.send({"id": request_id, "type": "error", "message": f"unknown request type {kind}"})

    async def call(self, request_id: str, tool_id: str, raw: Any, context: Message,
                   recording: Recording | None = None) -> None:
        recording = recording or Recording({})
        span = recording.start(f"toolhost.execute {tool_id}", {
            "gen_ai.tool.name": tool_id, "gen_ai.tool.call.id": str(context.get("callID", "")),
        })

        def reply(message: Message) -> None:
            # The span ends before the reply, which carries it.
            if span is not None:
                if message["type"] == "error":
                    span.fail(str(message["message"]))
                span.end()
            self.send({**message, **recording.field()})

        loaded = self.registry.tools.get(tool_id)
        if loaded is None:
            reply({"id": request_id, "type": "error", "message": f"Unknown tool: {tool_id}"})
            return
        if span is not None:
            span.set("sandbox.tool.origin", loaded.origin).set("sandbox.tool.source", "custom")
        try:
            args = loaded.tool.parse(raw)
        except InvalidArguments as exc:
            message = (f"The {tool_id} tool was called with invalid arguments: {exc}.\n"
                       "Please rewrite the input so it satisfies the expected schema.")
            reply({"id": request_id, "type": "error", "message": message})
            return
        loop = asyncio.get_running_loop()
        abort = asyncio.Event()

        def send_metadata(title: str | None, metadata: dict[str, Any] | None) -> None:
            update: Message = {"id": request_id, "type": "metadata"}
            if title is not None:
                update["title"] = title
            if metadata is not None:
                update["metadata"] = metadata
            self.send(update)

        async def ask(permission: str, patterns: list[str], always: list[str], metadata: dict[str, Any]) -> None:
            await self.ask(request_id, permission, patterns, always, metadata)

        ctx = ToolContext(
            session_id=str(context.get("sessionID", "")), message_id=str(context.get("messageID", "")),
            agent=str(context.get("agent", "")), call_id=str(context.get("callID", "")),
            directory=str(context.get("directory") or os.getcwd()),
            worktree=str(context.get("worktree") or os.getcwd()),
            extra=dict(context.get("extra") or {}), abort=abort, _send_metadata=send_metadata, _ask=ask, _loop=loop,
        )
        execute = loaded.tool.execute
        # A callable object counts as async when its __call__ is.
        is_async = inspect.iscoroutinefunction(execute) or inspect.iscoroutinefunction(type(execute).__call__)
        children: set[int] = set()
        recording_children = CHILDREN.set(children)  # the task (and to_thread's worker) copy this context
        logging_scope = pyhost_logs.Scope(request_id, loaded.origin)
        logging_call = pyhost_logs.SCOPE.set(logging_scope)
        try:
            work = execute(args, ctx) if is_async else asyncio.to_thread(execute, args, ctx)
            task = asyncio.ensure_future(work)
        finally:
            CHILDREN.reset(recording_children)
            pyhost_logs.SCOPE.reset(logging_call)
        self.running[request_id] = Running(task, abort, is_async, children)
        try:
            result = await task
            if inspect.isawaitable(result):
                result = await result
            outcome: Message = {"id": request_id, "type": "result", **normalise(result)}
        except asyncio.CancelledError:
            outcome = {"id": request_id, "type": "error", "message": ABORTED}
        except BaseException as exc:  # whatever a tool raises is that call's error, never the host's end
            outcome = {"id": request_id, "type": "error", "message": describe(exc)}
        finally:
            del self.running[request_id]
            pyhost_logs.finish(logging_scope)  # the call's last lines, before its reply
        try:
            json.dumps(outcome)  # fails before the span is ended, so the error reply still carries it
        except (TypeError, ValueError) as exc:
            outcome = {"id": request_id, "type": "error",
                       "message": f"The {tool_id} tool returned a result that is not JSON: {exc}"}
        reply(outcome)

    async def ask(self, request_id: str, permission: str, patterns: list[str], always: list[str],
                  metadata: dict[str, Any]) -> None:
        ask_id = f"{request_id}.{next(self._ask_ids)}"
        answer: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        self.asks[ask_id] = (request_id, answer)
        self.send({"id": request_id, "type": "ask", "ask_id": ask_id, "permission": permission,
                   "patterns": patterns, "always": always, "metadata": metadata})
        try:
            allowed, message = await answer
        finally:
            self.asks.pop(ask_id, None)
        if not allowed:
            raise PermissionDenied(message)

    def answer(self, ask_id: str, allowed: bool, message: str) -> None:
        _, answer = self.asks.pop(ask_id, ("", None))
        if answer is None:
            log(f"ask_reply for unknown ask {ask_id}")
        elif not answer.done():
            answer.set_result((allowed, message))

    def abort(self, request_id: str) -> None:
        running = self.running.get(request_id)
        if running is None:
            return
        running.abort.set()
        for ask_id, (owner, answer) in list(self.asks.items()):
            if owner == request_id and not answer.done():
                del self.asks[ask_id]
                answer.set_result((False, ABORTED))
        loop = asyncio.get_running_loop()
        if running.is_async:
            # A synchronous tool's thread cannot be interrupted: the driver abandons it, or stops an idle host.
            loop.call_later(CANCEL_AFTER_S, running.task.cancel)

        def end_children() -> None:
            if self.running.get(request_id) is running:
                kill_all(running.children)

        loop.call_later(ABORT_GRACE_S, end_children)


async def serve(channel: Channel) -> None:
    host = Host(channel)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    in_flight: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        try:
            request = json.loads(line)
        except ValueError:
            log(f"ignored a line that is not JSON: {line[:200]!r}")
            continue
        if request.get("type") == "load":
            # Loads are synchronous imports: whatever comes after them waits, as it should.
            try:
                reply = host.registry.load(list(request.get("files") or []), Recording(request))
                host.send({"id": request.get("id"), **reply})
            except Exception as exc:
                host.send({"id": request.get("id"), "type": "error", "message": describe(exc)})
            continue
        task = asyncio.ensure_future(host.handle(request))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    # The driver closed stdin: finish what was asked (it kills the host if that takes too long).
    if in_flight:
        await asyncio.wait(in_flight)


def main() -> None:
    gc.enable()
    sys.dont_write_bytecode = True  # importing a tool must not leave __pycache__ in the user's project
    channel = Channel()
    pyhost_logs.capture(channel.send)
    # pydantic's messages end with a documentation link per error: noise for the model.
    os.environ["PYDANTIC_ERRORS_INCLUDE_URL"] = "0"
    asyncio.run(serve(channel))
    sys.stderr.flush()
    os._exit(0)  # worker threads of synchronous tools must not keep the host alive


if __name__ == "__main__":
    main()
