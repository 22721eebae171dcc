"""Which language server handles which file, and each session's running servers.

A session gets one server per (server, root), started lazily as the tool user the first time a file
needs it and started again when it has died. A server that cannot be started or initialized is
marked broken for that root, as upstream does, and the file type then counts as unsupported.
`SessionState.lsp` holds a session's servers; the module also indexes them by session id so the
agent can stop them when a session ends (`close_session`) or when it shuts down (`close_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sandbox_agent.errors import AgentError
from sandbox_agent.lsp.client import LspClient
from sandbox_agent.process import Execution
from sandbox_agent.server_identity import LSP_SERVER, ServerIdentityError, verify_server

if TYPE_CHECKING:
    from sandbox_agent.tools.base import SessionState


PYHOST_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pyhost")


class ProcessStarter(Protocol):
    """What starting a server needs from the tool runner (`ToolRunner.start_server`)."""

    async def start_server(self, argv: list[str], *, cwd: str, env: dict[str, str], kind: int) -> Execution: ...

    def server_uid(self, kind: int) -> int: ...

    @property
    def separates_servers(self) -> bool: ...


@dataclass(frozen=True)
class ServerSpec:
    id: str
    extensions: frozenset[str]
    """File extensions served (with the dot); empty means every file."""
    language_ids: Mapping[str, str]
    """The LSP languageId of each extension."""
    root_markers: tuple[str, ...]
    """Files whose nearest directory (up to the project directory) becomes the server's root."""
    argv: tuple[str, ...]
    venv_names: tuple[str, ...] = field(default=())
    """Directories under the root that may hold the project's Python environment."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """initializationOptions sent to every instance."""
    waits_for_diagnostics: bool = True
    """Whether a touched file waits for the server's diagnostics, as upstream does, before the request."""

    def serves(self, path: str) -> bool:
        return not self.extensions or file_extension(path) in self.extensions

    def language_id(self, path: str) -> str:
        return self.language_ids.get(file_extension(path), "plaintext")

    def find_root(self, path: str, project: str) -> str:
        """Blocking (call through `ctx.io`): the nearest ancestor holding a marker, else the project."""
        current = os.path.dirname(path)
        while True:
            if any(os.path.exists(os.path.join(current, marker)) for marker in self.root_markers):
                return current
            parent = os.path.dirname(current)
            if current == project or parent == current:
                return project
            current = parent

    def initialization(self, root: str) -> dict[str, Any]:
        """Blocking (call through `ctx.io`): initializationOptions; points jedi at the project's venv."""
        options = dict(self.options)
        for name in self.venv_names:
            candidate = os.path.join(root, name)
            if os.path.isfile(os.path.join(candidate, "bin", "python")):
                options["workspace"] = {**options.get("workspace", {}), "environmentPath": candidate}
                break
        return options


PYTHON = ServerSpec(
    id="jedi",
    extensions=frozenset({".py", ".pyi"}),
    language_ids={".py": "python", ".pyi": "python"},
    # The same markers upstream uses to root its Python server.
    root_markers=("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "Pipfile", "pyrightconfig.json"),
    # The agent's own interpreter is the one the image installs jedi-language-server for; the package
    # has no __main__, and its console script may not be on the tool user's PATH.
    # pyhost_identity (first) restores the server's own saved uid, as in the Python tool host. The host's
    # other measures (children as the plain tool user) are not taken: with them jedi's workspace search
    # found nothing, and its children are its own environment probes, not a tool's commands.
    # -P: with -c the cwd (the project root, model-writable) would come first on sys.path, and a planted
    # ctypes.py would run before pyhost_identity takes the server's identity (as root on gVisor).
    argv=(sys.executable, "-P", "-s", "-B", "-c",
          f"import sys; sys.path.insert(0, {PYHOST_DIR!r}); import pyhost_identity; pyhost_identity.protect(); "
          "from jedi_language_server.cli import cli; sys.exit(cli())"),
    venv_names=(".venv", "venv"),
    # jedi answers from the text it was sent, and its diagnostics (syntax errors only) come after a
    # 1 s debounce: waiting for them would only add a second to every call, so they are turned off.
    options={"diagnostics": {"enable": False}},
    waits_for_diagnostics=False,
)
SERVERS: tuple[ServerSpec, ...] = (PYTHON,)


def file_extension(path: str) -> str:
    """Node's `path.parse(path).ext || path`, which is how upstream matches servers to files."""
    return os.path.splitext(os.path.basename(path))[1] or path


def specs_for(path: str) -> list[ServerSpec]:
    return [spec for spec in SERVERS if spec.serves(path)]


class LspStartError(AgentError):
    """A language server could not be started or did not complete the initialize handshake."""


class SessionServers:
    """The language servers of one session, keyed by (server id, root)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._clients: dict[tuple[str, str], LspClient] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._broken: set[tuple[str, str]] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def usable(self, spec: ServerSpec, root: str) -> bool:
        return (spec.id, root) not in self._broken

    def running(self) -> list[LspClient]:
        """Every live server of the session (workspace-wide operations ask them all)."""
        return [client for client in self._clients.values() if client.alive]

    async def client(self, spec: ServerSpec, root: str, starter: ProcessStarter,
                     initialization: dict[str, Any] | None = None) -> LspClient | None:
        """The live server for (spec, root), started now if needed; None when it is broken."""
        key = (spec.id, root)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if self._closed:
                raise LspStartError(f"the language servers of session {self.session_id} are closed")
            if key in self._broken:
                return None
            current = self._clients.get(key)
            if current is not None and current.alive:
                return current
            if current is not None:
                del self._clients[key]
                await current.kill()
            try:
                started = await self._start(spec, root, starter, initialization or {})
            except (AgentError, OSError):
                self._broken.add(key)
                return None
            self._clients[key] = started
            return started

    async def _start(self, spec: ServerSpec, root: str, starter: ProcessStarter,
                     initialization: dict[str, Any]) -> LspClient:
        # A server of its own identity (see server_identity): no tool process can ptrace, read or signal it.
        execution = await starter.start_server(list(spec.argv), cwd=root, env={}, kind=LSP_SERVER)
        if starter.separates_servers:
            try:
                await verify_server(execution.pid, starter.server_uid(LSP_SERVER), f"the {spec.id} language server")
            except ServerIdentityError:
                execution.stop(reason="not protected")
                raise
        return await LspClient.start(execution, name=spec.id, root=root, initialization_options=initialization)

    async def close(self) -> None:
        self._closed = True
        clients = list(self._clients.values())
        self._clients.clear()
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


_SESSIONS: dict[str, SessionServers] = {}


def session_servers(state: SessionState, session_id: str) -> SessionServers:
    """The session's servers, created on first use and kept in its `SessionState`."""
    if state.lsp is None or state.lsp.closed or state.lsp.session_id != session_id:
        state.lsp = SessionServers(session_id)
        _SESSIONS[session_id] = state.lsp
    return state.lsp


async def close_session(session_id: str) -> None:
    """Stops every language server of the session (its end); later calls start new ones."""
    servers = _SESSIONS.pop(session_id, None)
    if servers is not None:
        with contextlib.suppress(Exception):
            await servers.close()


async def close_all() -> None:
    """Stops every language server of every session (agent shutdown)."""
    sessions = list(_SESSIONS)
    await asyncio.gather(*(close_session(session_id) for session_id in sessions))
