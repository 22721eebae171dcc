"""What discovery hands to a tool host: the files to load, and the ones it could not offer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostFile:
    path: str
    """Absolute path as discovered (symlinks not resolved: the file stem names its tools)."""
    kind: str
    """"tool" (a `{tool,tools}/` file) or "plugin" (a plugin module)."""


@dataclass(frozen=True)
class LoadError:
    """A file or plugin spec that was not offered to a host, in the protocol's `load_errors` shape."""

    origin: str
    message: str
