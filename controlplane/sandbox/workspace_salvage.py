"""A retired sandbox's workspace volume read without its agent (the agent is gone: the session FAILED), so that
its work can be kept as a retained snapshot (core/sessions/pausing.py).

Nothing of the workspace runs: a container is created with the volume mounted read-only and is never started;
the engine copies the directory out of it (`docker cp` works on a stopped container's volumes), and the container
is removed. It carries the instance's labels and no sandbox's, so a crash in between leaves something
reconciliation removes without touching the workspace.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
from typing import Any

import docker.errors
from docker.types import Mount

from controlplane.errors import ResourceExhaustedError, SandboxError
from controlplane.sandbox.layout import LABEL_IMAGE, LABEL_INSTANCE, LABEL_MANAGED, WORKSPACE

MAX_BYTES = 1 << 30
"""The most read: what any workspace copy may expand to (limits of snapshots and forks)."""


def read(client: Any, volume: str, labels: dict[str, str]) -> bytes:
    """The workspace as a tar whose names are relative to it, as the agent's download gives them."""
    own = {LABEL_MANAGED: labels[LABEL_MANAGED], LABEL_INSTANCE: labels[LABEL_INSTANCE]}
    try:
        container = client.containers.create(
            labels[LABEL_IMAGE], command=["true"], network_mode="none", labels=own, user="65534:65534",
            mounts=[Mount(WORKSPACE, volume, type="volume", read_only=True, no_copy=True)],
        )
    except docker.errors.APIError as exc:
        raise SandboxError(f"the workspace volume {volume} cannot be read: {exc.explanation or exc}") from exc
    try:
        chunks, _ = container.get_archive(WORKSPACE + "/.")
        raw = bytearray()
        for chunk in chunks:
            raw += chunk
            if len(raw) > MAX_BYTES:
                raise ResourceExhaustedError(f"the workspace is larger than the {MAX_BYTES} bytes a copy may hold")
        return relative(bytes(raw))
    except docker.errors.APIError as exc:
        raise SandboxError(f"the workspace volume {volume} cannot be read: {exc.explanation or exc}") from exc
    finally:
        # Never started, so its removal is quick: the engine's slowness that container_removal waits out
        # (tearing down a running sandbox) does not arise here.
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(container.id, force=True)


def relative(tar: bytes) -> bytes:
    """The engine names entries after the copied directory (`./x` or `workspace/x`): renamed to `x`."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r|") as source, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as copy:
        for member in source:
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not parts[1].strip("/"):
                continue  # the directory itself
            member.name = parts[1]
            if member.islnk():  # a hard link names its target by the same path
                member.linkname = member.linkname.split("/", 1)[-1]
            copy.addfile(member, source.extractfile(member) if member.isreg() else None)
    return out.getvalue()
