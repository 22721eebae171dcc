"""Control planes for tests: in-process (docker or local provider) and as a real subprocess."""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import docker
import pytest

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from controlplane.sandbox import dir_mounts
from controlplane.sandbox.workspace_disk import WorkspaceDisks
from tests.archives import tar_of

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def short_tmp() -> Path:
    """Unix socket paths are limited to 107 bytes, so data dirs live in a short /tmp path."""
    return Path(tempfile.mkdtemp(prefix="ocsb", dir="/tmp"))


def new_instance(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


@dataclass
class Plane:
    plane: app.ControlPlane
    client: AsyncClient
    token: str

    @property
    def instance(self) -> str:
        return self.plane.settings.instance


@asynccontextmanager
async def running_plane(provider: str = "docker", **overrides: Any) -> AsyncIterator[Plane]:
    data_dir = short_tmp()
    instance = overrides.pop("instance", new_instance())
    provider_settings: dict[str, Any] = {"type": provider, **overrides.pop("provider_options", {})}
    if provider == "docker" and os.environ.get("OCSB_TEST_IMAGE"):
        # A checkout beside main builds and tests its own image (OCSB_IMAGE_TAG at build time).
        provider_settings["image"] = os.environ["OCSB_TEST_IMAGE"]
    settings = load_settings(
        None, data_dir=data_dir, instance=instance, provider=provider_settings,
        server={"listen": "127.0.0.1:0", **overrides.pop("server", {})}, **overrides,
    )
    plane = await app.start(settings)
    tenants = overrides.get("tenants")
    token = tenants[0]["token"] if tenants else (data_dir / "default.token").read_text().strip()
    client = AsyncClient(plane.address, token)
    try:
        yield Plane(plane, client, token)
    finally:
        for session in await client.list_sessions():
            await client.delete_session(session.id)
        await client.close()
        await app.stop(plane)
        remove_instance_leftovers(instance)
        remove_data_dir(data_dir)


def served_plane(provider: str = "local", *, name: str = "plane",
                 scope: Literal["session", "module", "function"] = "module",
                 needs: tuple[str, ...] = (), **overrides: Any) -> Any:
    """The one fixture for a control plane serving gRPC on a loopback port: `plane = served_plane(...)` in a test
    module (or conftest) defines a fixture `name` running `running_plane(provider, **overrides)`.

    `needs` names fixtures set up first: those whose effect the plane reads only when it starts (environment
    flags, OpenTelemetry's SDK provider).
    """

    async def served(**_needed: object) -> AsyncIterator[Plane]:
        async with running_plane(provider, **overrides) as plane:
            yield plane

    return pytest.fixture(scope=scope, name=name)(_asking_for(served, *needs))


def workspace_session(files: Mapping[str, str | bytes], *, config_json: str = "", plane: str = "docker_plane") -> Any:
    """A module's fixture `session_id`: one session on `plane` (a fixture's name) whose workspace holds
    `files` (and whose config is `config_json`), shared by the module's tests and deleted after them."""

    async def session_id(**fixtures: Plane) -> AsyncIterator[str]:
        served = fixtures[plane]
        session = await served.client.create_session(workspace_archive=tar_of(files), config_json=config_json)
        yield session.id
        await served.client.delete_session(session.id)

    return pytest.fixture(scope="module", name="session_id")(_asking_for(session_id, plane))


def tenant_clients(tenants: list[dict[str, Any]], *, plane: str = "plane") -> Any:
    """A test's fixture `clients`: a client per tenant of `tenants` (name -> client) on `plane` (a fixture's
    name); each tenant's sessions are deleted after the test."""

    async def clients(**fixtures: Plane) -> AsyncIterator[dict[str, AsyncClient]]:
        served = fixtures[plane]
        made = {t["name"]: AsyncClient(served.plane.address, t["token"]) for t in tenants}
        yield made
        for client in made.values():
            for session in await client.list_sessions():
                await client.delete_session(session.id)
            await client.close()

    return pytest.fixture(name="clients")(_asking_for(clients, plane))


def _asking_for(function: Callable[..., T], *fixtures: str) -> Callable[..., T]:
    """`function` (taking **kwargs) with a signature naming `fixtures`, so that pytest sets them up first and
    passes them in, whatever their names (a fixture asked for by a running async fixture could not be set up)."""
    parameters = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in fixtures]
    function.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    return function


def environment(name: str, values: Mapping[str, str], *, cleared: tuple[str, ...] = ()) -> Any:
    """A module-wide fixture `name` that sets `values` and removes `cleared` from the environment, restoring
    both after the module: for variables a control plane reads only when it starts (pass `name` in
    `served_plane(needs=...)`)."""

    @pytest.fixture(scope="module", name=name)
    def patched() -> Iterator[None]:
        with pytest.MonkeyPatch.context() as patch:
            for key in cleared:
                patch.delenv(key, raising=False)
            for key, value in values.items():
                patch.setenv(key, value)
            yield

    return patched


def instance_containers(instance: str) -> list[Any]:
    """The instance's containers. docker-py inspects each listed one, and a container removed in between (a
    warm-pool refill, an orphan being reconciled, a disk helper ending) is gone: it is left out."""
    return docker.from_env().containers.list(all=True, filters={"label": f"ocsb.instance={instance}"},
                                             ignore_removed=True)


def container_gone(ref: str) -> bool:
    """Whether no container has this id or name. Asked of the one container: a listing of all of them
    inspects each and fails when another test's container is removed meanwhile."""
    try:
        docker.from_env().containers.get(ref)
    except docker.errors.NotFound:
        return True
    return False


def instance_volumes(instance: str) -> list[Any]:
    """The instance's volumes: by label, and by name (the engine makes a mount's missing volume without labels)."""
    client = docker.from_env()
    labelled = client.volumes.list(filters={"label": f"ocsb.instance={instance}"})
    named = [v for v in client.volumes.list(filters={"name": f"ocsb-{instance}-"})
             if (v.name or "").startswith(f"ocsb-{instance}-")]
    return list({v.name: v for v in [*labelled, *named]}.values())


def remove_instance_leftovers(instance: str) -> int:
    """Removes (by id) whatever a test's own instance left, and says how much there was."""
    client = docker.from_env()
    left = 0
    for container in client.containers.list(all=True, filters={"label": f"ocsb.instance={instance}"},
                                            ignore_removed=True):
        container.remove(force=True)
        left += 1
    for volume in instance_volumes(instance):
        volume.remove(force=True)
        left += 1
    return left


def remove_data_dir(data_dir: Path) -> None:
    """Deletes a test plane's data dir with what the host holds for it: sandbox dirs mounted as tmpfs, and the loop
    devices of workspace disk images (a plane killed mid-create attached one whose volume was never made: deleting
    the image alone left the device attached to a deleted file for good). After remove_instance_leftovers."""
    dir_mounts.unmount_all_under(data_dir)
    disks = WorkspaceDisks(data_dir, 0)
    for sandbox_id in disks.list_ids():
        disks.release(sandbox_id)
    shutil.rmtree(data_dir, ignore_errors=True)


class PlaneProcess:
    """`python -m controlplane serve` as a child process, so it can be SIGKILLed."""

    def __init__(self, data_dir: Path, instance: str, pool_size: int = 1) -> None:
        self.data_dir = data_dir
        self.instance = instance
        self.env = os.environ | {
            "CONTROLPLANE_DATA_DIR": str(data_dir),
            "CONTROLPLANE_INSTANCE": instance,
            "CONTROLPLANE_SERVER__LISTEN": "127.0.0.1:0",
            "CONTROLPLANE_POOL__SIZE": str(pool_size),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> str:
        endpoint = self.data_dir / "endpoint"
        endpoint.unlink(missing_ok=True)
        log = self.data_dir / "serve.log"
        env = dict(self.env)
        if os.environ.get("OCSB_TEST_IMAGE") and env.get("CONTROLPLANE_PROVIDER__TYPE", "docker") == "docker":
            # As running_plane: a checkout beside main runs its own image (a test may pick the local provider).
            env |= {"CONTROLPLANE_PROVIDER__TYPE": "docker",
                    "CONTROLPLANE_PROVIDER__IMAGE": os.environ["OCSB_TEST_IMAGE"]}
        with log.open("ab") as out:
            self.proc = subprocess.Popen(  # noqa: ASYNC220 - spawning returns at once
                [sys.executable, "-m", "controlplane", "serve"], env=env, cwd=REPO,
                stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not endpoint.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"control plane died: {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("control plane did not start")
            await asyncio.sleep(0.05)
        return endpoint.read_text().strip()

    def token(self) -> str:
        return (self.data_dir / "default.token").read_text().strip()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(self.proc.wait, 30)
