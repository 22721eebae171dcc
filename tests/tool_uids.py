"""The tool uid the Docker provider gave a sandbox (controlplane/sandbox/tool_ids.py), read from its container."""

from __future__ import annotations

import docker


def tool_uid(instance: str, sandbox_id: str) -> int:
    """The sandbox's own tool uid: its container's `ocsb.tool_uid` label (its servers' uids follow it)."""
    container = docker.from_env().containers.get(f"ocsb-{instance}-{sandbox_id}")
    return int(container.labels["ocsb.tool_uid"])
