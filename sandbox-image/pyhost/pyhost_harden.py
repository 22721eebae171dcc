"""Makes the Python tool host untouchable by the session's tool processes; imported first by host.py.

The agent starts the host with real uid = the host's own uid and effective uid = the tool user, so the
files tools create still belong to the tool user; `pyhost_identity` restores the saved uid, after which
no tool process can signal, ptrace or read the host's memory.

Children must not inherit the host's real uid: they could signal the host, and a shell started with
real != effective uid drops to the real uid (bash and dash do), so its files would belong to the host uid.
Every way the standard library starts a program is made to start it as the tool user only: `subprocess`
(and so `os.popen`, asyncio's subprocesses) with `user=`, `os.fork` (and what forks through it) with an
at-fork hook, `os.system` through `subprocess`, `os.posix_spawn[p]` through `setpriv --ruid`.
Files the host reads at run time must not be replaceable either: see `_no_bytecode_from_writable_dirs`.

The host enters proc_guard's Landlock domain (no write under /proc) itself, as the very first step of its
hardening: the agent starts it without the separate `python3` that entered the domain and exec'd the rest of the
chain for the other servers (one interpreter start less on every Python host start, docs/performance.md). No
code of the tool user's runs before this: the host's own modules and the standard library come from root-owned
directories, and the tool files are imported only after the agent checked the host's identity.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import pyhost_identity

SETPRIV = "/usr/bin/setpriv"


def _drop_in_child(uid: int) -> None:
    os.setresuid(uid, uid, uid)


def _lent(uid: int, spawn: Callable[[], int]) -> int:
    """`spawn` with the host's real uid lent to the tool user: where an exec sets the effective uid to the real
    one (gVisor), `setpriv --ruid` cannot start a child, which must be the tool user's before its exec. A tool
    process could signal the host for that moment, never ptrace it (its saved uid stays its own)."""
    server = os.getresuid()[2]
    os.setresuid(uid, -1, -1)
    try:
        return spawn()
    finally:
        try:
            os.setresuid(server, -1, -1)
        except OSError:
            os._exit(70)  # a host left with the tool user's real uid must not go on


def _patch_children(uid: int) -> None:
    popen_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        if kwargs.get("user") is None:
            kwargs["user"] = uid
        popen_init(self, *args, **kwargs)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]

    def system(command: str) -> int:
        code = subprocess.call(command, shell=True)
        return code << 8 if code >= 0 else -code  # os.system's wait status

    os.system = system
    os.register_at_fork(after_in_child=lambda: _drop_in_child(uid))

    for name in ("posix_spawn", "posix_spawnp"):
        original = getattr(os, name)

        def spawn(path: str, argv: Sequence[str], env: Any, *rest: Any, _original: Any = original,
                  **kwargs: Any) -> int:
            if pyhost_identity.ROOT_STARTED:
                return _lent(uid, lambda: int(_original(path, argv, env, *rest, **kwargs)))
            through = [SETPRIV, f"--ruid={uid}", "--", path, *list(argv)[1:]]
            return int(_original(SETPRIV, through, env, *rest, **kwargs))

        setattr(os, name, spawn)


def _no_bytecode_from_writable_dirs() -> None:
    """A `.pyc` is read instead of its source when its header matches the source's mtime and size: one
    forged in a `__pycache__` the tool user can write (a tool's own folder) would run its code here.
    Sources in such folders are compiled from their text; the image's root-owned ones keep their caches.
    """
    import _frozen_importlib_external as external  # the module whose loaders the import system uses

    original = external.cache_from_source

    def cache_from_source(path: str, *args: Any, **kwargs: Any) -> str:
        folder = os.path.dirname(os.path.abspath(path))
        try:
            info = os.stat(folder)
        except OSError as exc:
            raise NotImplementedError from exc
        if info.st_uid != 0 or info.st_mode & 0o022:
            raise NotImplementedError  # the loaders take this as "no bytecode cache for this source"
        return str(original(path, *args, **kwargs))

    external.cache_from_source = cache_from_source


PROC_GUARD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox_agent", "proc_guard.py")
"""The agent's own module, loaded by path: the host's import path does not hold the agent's package."""


def enter_proc_guard() -> bool:
    """Enters proc_guard's domain (False where the kernel has no Landlock or the sandbox no no_new_privs, as for
    every other process of the sandbox); an error here ends the host's start, so no host runs outside it."""
    spec = importlib.util.spec_from_file_location("_pyhost_proc_guard", PROC_GUARD)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {PROC_GUARD}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return bool(module.restrict_proc_writes())


def harden() -> bool:
    """True when the host runs under its own uid (inside the sandbox) and is now protected."""
    enter_proc_guard()
    euid = pyhost_identity.protect()
    if euid is None:
        return False  # an unprivileged test run: nothing to separate from
    _patch_children(euid)
    _no_bytecode_from_writable_dirs()
    return True


HARDENED = harden()
