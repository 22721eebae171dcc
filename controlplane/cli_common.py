"""What the command-line modules share: finding the control plane (controlplane.discovery, the SDK's rule too)
and telling a rerouted call apart."""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.discovery import DEFAULT_DATA_DIR, DEFAULT_LISTEN, ENDPOINT_FILE, Place, find_endpoint, place

__all__ = ["DEFAULT_DATA_DIR", "DEFAULT_LISTEN", "ENDPOINT_FILE", "Place", "admin_target_and_token", "place",
           "rerouted", "target_and_token"]


def target_and_token(args: argparse.Namespace) -> tuple[str, str]:
    """--target, $CONTROLPLANE_TARGET or the data dir's endpoint; --token, $CONTROLPLANE_TOKEN or the default
    tenant's token file."""
    return find_endpoint(args.target, args.token, config=args.config)


def admin_target_and_token(args: argparse.Namespace) -> tuple[str, str]:
    """As target_and_token, with the admin token ($CONTROLPLANE_ADMIN_TOKEN or the data dir's admin.token)."""
    return find_endpoint(args.target, args.token, config=args.config, admin=True)


INVALID_TITLE = "Invalid Tool"
"""The title of the `invalid` tool's result (controlplane/tools/invalid.py)."""


def rerouted(result: Any) -> bool:
    """Whether a call's result is the `invalid` tool's: an unknown tool or unparseable arguments, which upstream
    reroutes there so that a model reads why. For a person or an MCP client that is a failed call."""
    return bool(result.title == INVALID_TITLE)
