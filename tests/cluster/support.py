"""The two-node swarm of `scripts/cluster.sh` and in-process control planes on it (tests and benchmarks)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from controlplane import app
from controlplane.client import AsyncClient
from controlplane.config import load_settings
from tests.planes import REPO, new_instance, short_tmp

CLUSTER = REPO / "scripts" / "cluster.sh"
TOKENS = {"alpha": "tok-alpha-" + "a" * 20, "beta": "tok-beta-" + "b" * 20, "gamma": "tok-gamma-" + "c" * 20}
"""alpha is placed on the manager, beta on the worker, gamma anywhere (node labels of cluster.sh)."""
TENANT_CONSTRAINTS = {"alpha": ["node.labels.ocsb.node==manager"], "beta": ["node.labels.ocsb.node==worker"]}


@dataclass
class Cluster:
    state: dict[str, str]

    @property
    def manager(self) -> str:
        return self.state["MANAGER_NODE"]

    @property
    def worker(self) -> str:
        return self.state["WORKER_NODE"]

    def worker_client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.state["WORKER_SOCK"])


def cluster_state() -> dict[str, str]:
    out = subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True, text=True, check=False).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def running_cluster() -> tuple[Cluster | None, str]:
    """The cluster `make cluster-up` made, or None and why there is none (never starts one)."""
    check = subprocess.run(["bash", str(CLUSTER), "check"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        return None, check.stdout.strip() or check.stderr.strip()
    state = cluster_state()
    if state.get("UP") != "1":
        return None, "no cluster is up: `make cluster-up`, or `make test-cluster` / `make bench-cluster`"
    cluster = Cluster(state)
    try:
        worker = cluster.worker_client()  # asks the daemon for its API version
        worker.ping()
        worker.close()
    except docker.errors.DockerException as exc:
        return None, f"the cluster's worker daemon does not answer ({exc}); run `make cluster-up`"
    return cluster, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SwarmPlane:
    plane: app.ControlPlane
    clients: dict[str, AsyncClient]

    @property
    def instance(self) -> str:
        return self.plane.settings.instance


@asynccontextmanager
async def swarm_plane(
    pool_size: int = 0, settings: dict[str, Any] | None = None, delete_sessions: bool = True, **provider: Any
) -> AsyncIterator[SwarmPlane]:
    """A Swarm-provider control plane in this process; `settings` and `provider` override the defaults."""
    data_dir = short_tmp()
    # A checkout beside main tests its own image (cluster.sh copies OCSB_IMAGE to the worker).
    image = {"image": os.environ["OCSB_TEST_IMAGE"]} if os.environ.get("OCSB_TEST_IMAGE") else {}
    loaded = load_settings(
        None, **{
            "data_dir": data_dir, "instance": new_instance("c"), "server": {"listen": "127.0.0.1:0"},
            "pool": {"size": pool_size}, "tenants": [{"name": n, "token": t} for n, t in TOKENS.items()],
            "provider": {"type": "swarm", "relay_port": free_port(), "watch_interval_s": 0.5,
                         "tenant_constraints": TENANT_CONSTRAINTS, **image, **provider},
            **(settings or {}),
        },
    )
    plane = await app.start(loaded)
    clients = {name: AsyncClient(plane.address, token) for name, token in TOKENS.items()}
    try:
        yield SwarmPlane(plane, clients)
    finally:
        for client in clients.values():
            if delete_sessions:
                for session in await client.list_sessions():
                    await client.delete_session(session.id)
            await client.close()
        provider_ = plane.sessions._provider  # the caller owns this plane
        await app.stop(plane)
        remove_relay = getattr(provider_, "remove_relay", None)
        if remove_relay is not None:
            await remove_relay()
        shutil.rmtree(data_dir, ignore_errors=True)
