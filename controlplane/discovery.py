"""Where a client finds the control plane and its token: one rule for the SDK's `connect()`, the sync `Client`
and every command of the CLI.

An explicit argument wins, then the environment (`CONTROLPLANE_TARGET`, `CONTROLPLANE_TOKEN`,
`CONTROLPLANE_ADMIN_TOKEN`), then what a running server wrote in its data dir (`endpoint`, the default
tenant's `default.token`, `admin.token`), then the configured listen address.

Importing a client must stay cheap: with no config file and no other `CONTROLPLANE_*` setting in the
environment, the defaults are known without loading pydantic-settings (a fifth of a second of the CLI's
start, checked by tests/unit/test_cli_imports.py). Any other case takes the full, typed `load_settings`, so
a bad config file is an error here as in `serve`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import ConfigError

ENDPOINT_FILE = "endpoint"
"""Written into the data dir by a serving control plane: the address it actually listens on."""
DEFAULT_DATA_DIR = "~/.local/share/ocsandbox"
DEFAULT_LISTEN = "127.0.0.1:50061"
TOKEN_FILE = "default.token"
"""In the data dir: the default tenant's token, written on first start (0600)."""
ADMIN_TOKEN_FILE = "admin.token"
"""In the data dir: the AdminService's token, written on first start (0600)."""
CLIENT_VARIABLES = {"CONTROLPLANE_TARGET", "CONTROLPLANE_TOKEN", "CONTROLPLANE_ADMIN_TOKEN"}


@dataclass(frozen=True)
class Place:
    """What a client needs of the operator's settings."""

    data_dir: Path
    listen: str

    @property
    def token_file(self) -> Path:
        return self.data_dir / TOKEN_FILE

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / ADMIN_TOKEN_FILE


def place(config: Path | str | None = None) -> Place:
    settings_in_env = any(k.startswith("CONTROLPLANE_") and k not in CLIENT_VARIABLES for k in os.environ)
    if config is None and not settings_in_env:
        return Place(Path(os.path.expanduser(DEFAULT_DATA_DIR)), DEFAULT_LISTEN)
    from controlplane.config import load_settings

    settings = load_settings(Path(config) if config else None)
    return Place(settings.data_dir, settings.server.listen)


def find_target(where: Place, target: str | None = None) -> str:
    """`target`, `CONTROLPLANE_TARGET`, the data dir's endpoint, or the configured listen address."""
    chosen = target or os.environ.get("CONTROLPLANE_TARGET") or None
    if chosen:
        return chosen
    endpoint = where.data_dir / ENDPOINT_FILE
    if endpoint.exists():
        written = endpoint.read_text().strip()
        if written:
            return written
    return where.listen


def find_endpoint(
    target: str | None = None, token: str | None = None, *, config: Path | str | None = None, admin: bool = False,
) -> tuple[str, str]:
    """(target, token) for a tenant's client, or for the admin client with `admin=True`.

    Raises ConfigError, saying every place a token can come from, when none is found."""
    where = place(config)
    if admin:
        path, variable, what = where.admin_token_file, "CONTROLPLANE_ADMIN_TOKEN", "admin token"
    else:
        path, variable, what = where.token_file, "CONTROLPLANE_TOKEN", "token"
    found = token or os.environ.get(variable) or None
    if not found and path.exists():
        found = path.read_text().strip() or None
    if not found:
        raise ConfigError(
            f"no {what}: pass one (--token, or token= to connect()), set {variable}, or start the server once "
            f"so that it writes {path}"
        )
    return find_target(where, target), found
