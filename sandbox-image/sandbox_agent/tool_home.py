"""What the tool user's HOME holds from the start: the directories upstream OpenCode creates when it starts.

Upstream's `Global` makes its data, config and state dirs (and `log` and `bin` under data) at start and writes
its cache's version file, so tools and plugins written for it keep their state there (a `bun:sqlite` database
under `~/.config/opencode`, a cache file, a log) and expect the directories to exist. HOME is on the sandbox's
writable tmpfs, made by the tool user with mode 700: that user alone (its uid is the sandbox's own) writes it,
and it is gone with the sandbox.
"""

from __future__ import annotations

import os

STATE_DIRS = (
    ".local/share/opencode",
    ".local/share/opencode/log",
    ".local/share/opencode/bin",
    ".config/opencode",
    ".local/state/opencode",
    ".cache/opencode",
)
"""Relative to HOME, as upstream's `Global.Path` names them with the XDG defaults."""
CACHE_VERSION = "21"
"""v1.2.27's cache version: its cache dir is emptied and the file rewritten when this differs."""


def make(home: str) -> None:
    """Makes HOME, its state dirs and the cache version file, each as `mkdir -p` with umask 077 would.

    Called with the tool user's filesystem identity (ToolRunner.io_now), so all of it belongs to that user; in
    the agent's own process rather than through a spawned shell, which took a process start (the spawner
    helper's interpreter, then `sh`) off every sandbox's start (docs/performance.md, 2026-11-28 12:30)."""
    made = {os.path.dirname(home.rstrip("/"))}  # the agent made the parent (a tmpfs's root or a test's dir)
    for relative in ("", *STATE_DIRS):
        path = os.path.join(home, relative) if relative else home.rstrip("/")
        chain = []
        while path not in made and path not in ("/", ""):
            chain.append(path)
            path = os.path.dirname(path)
        for directory in reversed(chain):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise
            made.add(directory)
    version = os.open(os.path.join(home, ".cache/opencode/version"),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(version, CACHE_VERSION.encode())
    finally:
        os.close(version)
