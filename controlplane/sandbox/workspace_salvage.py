"""A retired sandbox's workspace volume read without its agent (the agent is gone: the session FAILED), so that
its work can be kept as a retained snapshot (core/sessions/pausing.py).

Nothing of the workspace runs: a container is created with the volume mounted read-only and is never started;
the engine copies the directory out of it (`docker cp` works on a stopped container's volumes), and the container
is removed. It carries the instance's labels and no sandbox's, so a crash in between leaves something
reconciliation removes without touching the workspace.

The copy goes to a file under the plane's data dir, a piece at a time, never whole into the plane's memory. Its
caller bounds it in time (pausing.py's SALVAGE_TIMEOUT_S): a cancelled salvage stops its engine thread at the
next piece, and its container and file are removed by a tracked cleanup once that thread is over (a cancelled
`to_thread` await does not stop the thread), so neither outlives it; the sandbox's volume is removed only after
(the engine's removal waits for the container reading it to go), and a volume the engine makes again for a create
still in flight when it was removed (unlabelled) is removed by that cleanup too.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import secrets
import tarfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import docker.errors
import requests
from docker.types import Mount

from controlplane.core.calls.tracked_tasks import TrackedTasks
from controlplane.core.sessions.workspace_spool import pieces
from controlplane.errors import ResourceExhaustedError, SandboxError
from controlplane.sandbox.engine_calls import in_thread
from controlplane.sandbox.layout import LABEL_IMAGE, LABEL_INSTANCE, LABEL_MANAGED, WORKSPACE

log = logging.getLogger(__name__)
PIECE = 1 << 20
MAX_BYTES = 1 << 30
"""The most read: what any workspace copy may expand to (limits of snapshots and forks)."""


Chunks = AsyncIterator[bytes]
STALE_S = 600.0
"""A spooled salvage file this old is a leftover (a salvage is bounded to a minute): removed by the next one."""


async def read(client: Any, sandboxes: Path, volume: str, labels: dict[str, str],
               cleanups: TrackedTasks) -> AsyncIterator[bytes]:
    """The workspace as a tar whose names are relative to it, as the agent's download gives them; spooled under
    the data dir (`sandboxes`' parent) in a directory of the plane's instance."""
    directory = sandboxes.parent / "salvage" / labels[LABEL_INSTANCE]
    await asyncio.to_thread(_prepare, directory)
    into = directory / f"{volume}-{secrets.token_hex(4)}.tar"
    name = f"{volume}-salvage"
    stop = threading.Event()
    reading = in_thread(read_into, client, volume, labels, name, into, stop)
    try:
        await asyncio.shield(reading)
        async for chunk in pieces(into):
            yield chunk
    finally:
        # Also on a cancel: no await here (a cancelled generator must not be held up); the cleanup waits.
        stop.set()
        cleanups.start(_cleanup(client, reading, name, volume, into))


async def _cleanup(client: Any, reading: asyncio.Future[None], name: str, volume: str, into: Path) -> None:
    # Not before the thread is over: until its stream is closed, the engine would hold a removal of the container
    # (past docker-py's timeout, seen on 20.10). The thread stops at its next piece and closes that stream.
    await asyncio.wait({reading})
    if not reading.cancelled():
        reading.exception()  # seen: it was the caller's to report, and the caller is gone
    try:  # a create that completed after the first removal
        await asyncio.to_thread(_remove, client, name)
        # The session's volume removed while that create was in flight: the engine made it again for the mount,
        # without labels (the provider's own has them, and stays for a FAILED session).
        await asyncio.to_thread(_remove_unlabelled, client, volume)
    except docker.errors.APIError as exc:  # reconciliation removes it by its labels or name at the next start
        log.warning("the salvage of %s left something behind: %s", volume, exc.explanation or exc)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(into)


def read_into(client: Any, volume: str, labels: dict[str, str], name: str, into: Path, stop: threading.Event,
              limit: int = MAX_BYTES) -> None:
    """Writes the workspace's tar, renamed (`relative`), into the new file `into`; ends early once `stop` is set."""
    own = {LABEL_MANAGED: labels[LABEL_MANAGED], LABEL_INSTANCE: labels[LABEL_INSTANCE]}
    _remove(client, name)  # an earlier salvage's, left by a plane killed meanwhile
    try:
        container = client.containers.create(
            labels[LABEL_IMAGE], command=["true"], network_mode="none", labels=own, user="65534:65534", name=name,
            mounts=[Mount(WORKSPACE, volume, type="volume", read_only=True, no_copy=True)],
        )
    except docker.errors.APIError as exc:
        raise SandboxError(f"the workspace volume {volume} cannot be read: {exc.explanation or exc}") from exc
    raw = into.with_name(into.name + ".engine")
    try:
        _stopped(stop)
        with _archive(client, container.id) as chunks, open(raw, "xb") as out:
            size = 0
            for chunk in chunks:
                _stopped(stop)
                size += len(chunk)
                if size > limit:
                    raise ResourceExhaustedError(f"the workspace is larger than the {limit} bytes a copy may hold")
                out.write(chunk)
        with open(raw, "rb") as source, open(into, "xb") as out:
            _relative(source, out)
    except docker.errors.APIError as exc:
        raise SandboxError(f"the workspace volume {volume} cannot be read: {exc.explanation or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(raw)
        # Never started and its stream closed, so its removal is quick: the engine's slowness that
        # container_removal waits out (tearing down a running sandbox) does not arise here. A failure is left to
        # the cleanup, which removes it again once this thread is over.
        with contextlib.suppress(docker.errors.APIError):
            _remove(client, container.id)


@contextlib.contextmanager
def _archive(client: Any, container: str) -> Iterator[Iterator[bytes]]:
    """The engine's tar of the workspace, its connection closed on leaving, also early. docker-py's get_archive
    leaves the response open until garbage collection (never, while an exception's traceback holds the reading
    frame), and until it is closed the engine holds the container: its removal, and the volume's, wait on it."""
    url = f"{client.api.base_url}/v{client.api.api_version}/containers/{container}/archive"
    response = client.api.get(url, params={"path": WORKSPACE + "/."}, stream=True, timeout=client.api.timeout,
                              headers={"Accept-Encoding": "identity"})
    try:
        try:
            response.raise_for_status()
        except requests.exceptions.HTTPError as exc:
            raise docker.errors.create_api_error_from_http_exception(exc) from exc
        # The socket keeps the client's timeout (docker-py lifts it for this call): an engine that stops sending
        # ends the read, and the thread, within it.
        yield response.iter_content(PIECE)
    finally:
        response.close()


def relative(tar: bytes) -> bytes:
    """The engine names entries after the copied directory (`./x` or `workspace/x`): renamed to `x`."""
    out = io.BytesIO()
    _relative(io.BytesIO(tar), out)
    return out.getvalue()


def _relative(source: BinaryIO, out: BinaryIO) -> None:
    with tarfile.open(fileobj=source, mode="r|") as engine, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as copy:
        for member in engine:
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not parts[1].strip("/"):
                continue  # the directory itself
            member.name = parts[1]
            if member.islnk():  # a hard link names its target by the same path
                member.linkname = member.linkname.split("/", 1)[-1]
            copy.addfile(member, engine.extractfile(member) if member.isreg() else None)


def _stopped(stop: threading.Event) -> None:
    if stop.is_set():
        raise SandboxError("the workspace salvage was stopped (its caller gave up)")


def _remove(client: Any, ref: str) -> None:
    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(ref, force=True)


def _remove_unlabelled(client: Any, volume: str) -> None:
    try:
        found = client.volumes.get(volume)
    except docker.errors.NotFound:
        return
    if not (found.attrs.get("Labels") or {}).get(LABEL_INSTANCE):
        found.remove(force=True)


def _prepare(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = time.time()
    for left in directory.glob("*.tar*"):
        with contextlib.suppress(FileNotFoundError):
            if now - left.stat().st_mtime > STALE_S:
                left.unlink()
