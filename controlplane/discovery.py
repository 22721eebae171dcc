"""Where a client finds the control plane and its token: one rule for the SDK's `connect()` and the CLI.

An explicit argument wins, then the environment (`CONTROLPLANE_TARGET`, `CONTROLPLANE_TOKEN`,
`CONTROLPLANE_ADMIN_TOKEN`), then the data dir a running server wrote (`DATA_DIR/endpoint`, the default
tenant's `default.token`, `admin.token`), then the configured listen address. Kept free of the server's
modules so that importing a client stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.config import Settings, client_environment, load_settings
from controlplane.errors import ConfigError

ENDPOINT_FILE = "endpoint"
"""Written into the data dir by a serving control plane: the address it actually listens on."""


def find_target(settings: Settings, target: str | None = None) -> str:
    """The control plane's address: `target`, `CONTROLPLANE_TARGET`, the data dir's endpoint, or `server.listen`."""
    chosen = target or client_environment().target
    if chosen:
        return chosen
    endpoint = settings.data_dir / ENDPOINT_FILE
    if endpoint.exists():
        written = endpoint.read_text().strip()
        if written:
            return written
    return settings.server.listen


def find_endpoint(
    target: str | None = None, token: str | None = None, *, config: Path | None = None, admin: bool = False,
) -> tuple[str, str]:
    """(target, token) for a tenant's client, or for the admin client with `admin=True`.

    Raises ConfigError, saying every place a token can come from, when none is found."""
    settings = load_settings(config)
    env = client_environment()
    if admin:
        path, variable, what = settings.admin_token_file, "CONTROLPLANE_ADMIN_TOKEN", "admin token"
        found = token or env.admin_token
    else:
        path, variable, what = settings.token_file, "CONTROLPLANE_TOKEN", "token"
        found = token or env.token
    if not found and path.exists():
        found = path.read_text().strip()
    if not found:
        raise ConfigError(
            f"no {what}: pass one (--token, or token= to connect()), set {variable}, or start the server once "
            f"so that it writes {path}"
        )
    return find_target(settings, target), found
