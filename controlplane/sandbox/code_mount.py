"""The session's code snapshot dir: a root-owned tmpfs of its own, with no ancestor a tool process can write.

Why: the agent copies a session's custom tools and plugins at CreateSession into a directory the tool
user cannot change, and the Bun host loads them from there. But Bun looks upward from every loaded
file for `node_modules`, `package.json`, `tsconfig.json`/`jsconfig.json`: a snapshot under the sticky
/tmp had /tmp as an ancestor, so a `bash` call writing `/tmp/node_modules/@opencode-ai/plugin` or a
`/tmp/tsconfig.json` with `paths` turned model-written files into code in the host at its next start.
At CODE_DIR the ancestors are the mount itself (0755, root) and `/` (the read-only image), so every
upward lookup finds only the snapshot and the image's own files.

Both container providers mount it and check, fail-closed, that the engine really did (mode included:
a tmpfs defaults to 1777, which would bring the /tmp problem back).
"""

from __future__ import annotations

from typing import Any

from controlplane.sandbox.layout import CODE_DIR, CODE_MODE

MAX_CODE_MB = 256
"""Two snapshots of the agent's 128 MiB maximum: a ReloadTools copies the new code before removing the old."""


def code_mb(memory_mb: int) -> int:
    """The mount's size: tmpfs pages count against the container's memory, so a small session gets a share."""
    return max(16, min(MAX_CODE_MB, memory_mb // 8))


def docker_tmpfs(memory_mb: int) -> dict[str, str]:
    """The `tmpfs` entry of a container's create options (exec allowed: a local MCP server may be shipped)."""
    return {CODE_DIR: f"rw,nosuid,nodev,size={code_mb(memory_mb)}m,mode={CODE_MODE:o}"}


def container_problems(host_config: dict[str, Any]) -> list[str]:
    """What is wrong with the code mount in a created container's HostConfig ([] when it is as wanted)."""
    options = (host_config.get("Tmpfs") or {}).get(CODE_DIR)
    if options is None:
        return [f"the code snapshot dir {CODE_DIR} is not a tmpfs of its own"]
    modes = [o.split("=", 1)[1] for o in str(options).split(",") if o.startswith("mode=")]
    if not modes or int(modes[-1], 8) != CODE_MODE:
        return [f"the code snapshot dir {CODE_DIR} has options {options!r}, wanted mode={CODE_MODE:o}"]
    return []


def service_problems(mounts: list[dict[str, Any]]) -> list[str]:
    """The same for a swarm service's ContainerSpec.Mounts."""
    for mount in mounts:
        if mount.get("Target") == CODE_DIR:
            mode = ((mount.get("TmpfsOptions") or {}).get("Mode"))
            if mount.get("Type") != "tmpfs" or mode != CODE_MODE:
                return [f"the code snapshot dir {CODE_DIR} is a {mount.get('Type')} mount with mode {mode}, wanted "
                        f"a tmpfs with mode {CODE_MODE:o}"]
            return []
    return [f"the code snapshot dir {CODE_DIR} is not a tmpfs of its own"]
