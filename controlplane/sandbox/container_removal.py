"""Removing a sandbox's container and volume while the Docker engine is slow, without ever lying about it.

docker-py gives up on a request after its client timeout (60 s), but the engine goes on with a removal it has
started: a gVisor sandbox that held thousands of host tasks (a fork bomb's) can take longer than that to tear
down on a loaded machine. Treating the timeout as a failure surfaced a raw `ReadTimeout` as UNKNOWN from
DeleteSession; treating a 409 ("removal already in progress") as success let the volume's removal run into the
container still holding it. Here both are waited out, up to `REMOVAL_PATIENCE_S`, by asking again; past it the
caller gets a SandboxError (UNAVAILABLE) and the session stays held, so that the next delete or reaper round
tries again. The waits are the event loop's: only a request in flight holds one of the plane's few threads.
"""

from __future__ import annotations

import asyncio
import time

import docker
import docker.errors
import requests.exceptions

from controlplane.errors import SandboxError

REMOVAL_PATIENCE_S = 300.0
"""How long a removal may take before the caller is told; the engine keeps working on it after that."""
RETRY_PAUSE_S = 0.5

_ENGINE_SLOW = (requests.exceptions.Timeout, requests.exceptions.ConnectionError)


async def remove_container(api: docker.APIClient, name: str, patience_s: float = REMOVAL_PATIENCE_S) -> None:
    """Force-removes the container (and its anonymous volumes); returns once the engine no longer has it."""
    deadline = time.monotonic() + patience_s
    last = ""
    while True:
        try:
            await asyncio.to_thread(api.remove_container, name, force=True, v=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: the engine is removing it already (perhaps for our last request)
                raise
            last = "the engine is still removing it"
        except _ENGINE_SLOW as exc:
            last = f"the engine did not answer ({type(exc).__name__})"
        if time.monotonic() >= deadline:
            raise SandboxError(
                f"container {name} was not removed within {patience_s:.0f} s ({last}); the engine may still finish"
                " it, and the session's next delete or the reaper tries again"
            )
        await asyncio.sleep(RETRY_PAUSE_S)


async def remove_volume(api: docker.APIClient, name: str, patience_s: float = REMOVAL_PATIENCE_S) -> None:
    """Force-removes the volume once nothing holds it; a volume already gone is fine."""
    deadline = time.monotonic() + patience_s
    last = ""
    while True:
        try:
            await asyncio.to_thread(api.remove_volume, name, force=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: still in use, by a container whose removal is finishing
                raise
            last = "it is still in use"
        except _ENGINE_SLOW as exc:
            last = f"the engine did not answer ({type(exc).__name__})"
        if time.monotonic() >= deadline:
            raise SandboxError(f"volume {name} was not removed within {patience_s:.0f} s ({last}); the session's"
                               " next delete or the reaper tries again")
        await asyncio.sleep(RETRY_PAUSE_S)


async def remove_sandbox(api: docker.APIClient, container: str, volume: str) -> None:
    """The container, then its workspace volume, within one patience: a delete is bounded as a whole."""
    started = time.monotonic()
    await remove_container(api, container)
    await remove_volume(api, volume, patience_s=max(RETRY_PAUSE_S, REMOVAL_PATIENCE_S - (time.monotonic() - started)))
