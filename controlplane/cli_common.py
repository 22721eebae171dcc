"""Where a client command finds the control plane and its token, importing as little as it can.

The quickstart's commands (`session list`, `tool ...`) run in a fraction of a second only if they skip
pydantic-settings (a fifth of a second by itself): with no config file and no `CONTROLPLANE_*` setting in
the environment, the defaults are known without validating anything. Any other case takes the full, typed
`load_settings`, so a bad config file is still an error here as in `serve`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENDPOINT_FILE = "endpoint"
"""Written by a serving control plane in its data dir: its host:port."""
DEFAULT_DATA_DIR = "~/.local/share/ocsandbox"
DEFAULT_LISTEN = "127.0.0.1:50061"
_CLIENT_VARIABLES = {"CONTROLPLANE_TARGET", "CONTROLPLANE_TOKEN", "CONTROLPLANE_ADMIN_TOKEN"}


@dataclass(frozen=True)
class Place:
    """What a client needs of the operator's settings."""

    data_dir: Path
    listen: str

    @property
    def token_file(self) -> Path:
        return self.data_dir / "default.token"

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / "admin.token"


def place(config: str | None) -> Place:
    settings_in_env = any(k.startswith("CONTROLPLANE_") and k not in _CLIENT_VARIABLES for k in os.environ)
    if config is None and not settings_in_env:
        return Place(Path(os.path.expanduser(DEFAULT_DATA_DIR)), DEFAULT_LISTEN)
    from controlplane.config import load_settings

    settings = load_settings(Path(config) if config else None)
    return Place(settings.data_dir, settings.server.listen)


def target(args: argparse.Namespace, where: Place) -> str:
    found: str | None = args.target or os.environ.get("CONTROLPLANE_TARGET") or None
    if found:
        return found
    endpoint = where.data_dir / ENDPOINT_FILE
    return endpoint.read_text().strip() if endpoint.exists() else where.listen


def target_and_token(args: argparse.Namespace) -> tuple[str, str]:
    """--target, $CONTROLPLANE_TARGET or the data dir's endpoint; --token, $CONTROLPLANE_TOKEN or the default
    tenant's token file."""
    where = place(args.config)
    token = args.token or os.environ.get("CONTROLPLANE_TOKEN") or _read(where.token_file)
    if not token:
        raise SystemExit(
            f"no token: pass --token, set CONTROLPLANE_TOKEN, or start the server once ({where.token_file})"
        )
    return target(args, where), token


def admin_token_from_environment() -> str | None:
    return os.environ.get("CONTROLPLANE_ADMIN_TOKEN") or None


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


INVALID_TITLE = "Invalid Tool"
"""The title of the `invalid` tool's result (controlplane/tools/invalid.py)."""


def rerouted(result: Any) -> bool:
    """Whether a call's result is the `invalid` tool's: an unknown tool or unparseable arguments, which upstream
    reroutes there so that a model reads why. For a person or an MCP client that is a failed call."""
    return bool(result.title == INVALID_TITLE)
