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


def prepare_command(home: str) -> list[str]:
    """The command (run as the tool user) that makes HOME, its state dirs and the cache version file."""
    dirs = [os.path.join(home, d) for d in STATE_DIRS]
    version = os.path.join(home, ".cache/opencode/version")
    # Paths go in as arguments, never into the script's text.
    script = 'umask 077; mkdir -p "$@" && printf %s "$V" > "$F"'
    return ["/usr/bin/env", f"V={CACHE_VERSION}", f"F={version}", "/bin/sh", "-c", script, "sh", home, *dirs]
