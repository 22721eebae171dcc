"""Swarm workspaces that outlive their task (`provider.workspace_disk`): per sandbox, an ext4 image of
`workspace_mb` on a loop device on its node, mounted by a `local` volume, as sandbox/workspace_disk.py does on
one host. A task's tmpfs dies with its container; this volume stays on its node until the sandbox is
destroyed, so a FAILED session's work is read back through the node's engine (workspace_salvage) and kept.

The plane reaches a node only through its Docker engine (`provider.node_engines`, and the manager's own), so
the image and its loop device are made and released by a short-lived helper container on that node. It has
CAP_SYS_ADMIN (losetup), the loop devices alone in its device cgroup and the host's /dev (a loop device made after
it started shows only there); not `privileged`, which asks for capabilities an engine in a container may lack. That
is less than the engine API access the plane holds already (root on that node).

Placement: Swarm picks the node, so a disk is prepared on every candidate node before the service exists and
released on the others once the task runs (as the relays' socket dirs are). A node where it could not be made
is excluded from the placement, and the service's mount names a device that cannot exist, so a volume Swarm
would make by itself on a node without one fails to mount instead of becoming an unbounded host directory.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

import docker
import docker.errors
from docker.types import DriverConfig, Mount

from controlplane.errors import SandboxError, SandboxStartError
from controlplane.sandbox.layout import (
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_ROLE,
    LABEL_SANDBOX,
    WORKSPACE,
    WORKSPACE_MOUNT_OPTIONS,
    engine_name,
)

log = logging.getLogger("controlplane.sandbox.swarm")

ROLE = "workspace"
HELPER_ROLE = "disk-helper"
_VOLUME_REMOVE_S = 30.0
MISSING_DEVICE = "/dev/ocsb-no-workspace-disk"
"""Named by the service's mount: a node with no prepared volume gets one Swarm makes from these options, whose
mount fails, so the task fails rather than writing an unbounded workspace onto the node's disk."""

LOOP_DEVICES = ["b 7:* rwm", "c 10:237 rwm"]
"""The helper's only devices: loop block devices and /dev/loop-control."""
HELPER_MEMORY = 64 << 20
HELPER_TIMEOUT_S = 60
"""A mkfs of a sparse image takes well under a second; a helper stuck longer is removed and counts as failed."""

_HELPER = r"""
set -eu
op=$1; dir=/disks/$2; shift 2
mkdir -p "$dir"; chmod 700 /disks "$dir"
release() {
  for dev in $(losetup -j "$1" | cut -d: -f1); do losetup -d "$dev" || true; done
  rm -f "$1"
}
case $op in
make)
  f=$dir/$1.img
  trap 'release "$f"' EXIT
  truncate -s "$2M" "$f"
  mkfs.ext4 -q -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 "$f"
  debugfs -w -R "rmdir lost+found" "$f" >/dev/null 2>&1
  losetup --find --show "$f"
  trap - EXIT ;;
release)
  for id in "$@"; do release "$dir/$id.img"; done ;;
keep)
  for f in "$dir"/*.img; do
    [ -e "$f" ] || continue
    id=$(basename "$f" .img); case " $* " in *" $id "*) continue ;; esac
    release "$f"; echo "$id"
  done ;;
esac
"""
"""Image files are `DISK_ROOT/<instance>/<node id>/<sandbox>.img`: nodes may share a filesystem (this machine's
test cluster does), and each node's copy is its own."""


def volume_name(instance: str, sandbox_id: str) -> str:
    return engine_name(instance, f"{sandbox_id}-ws")


def service_mount(instance: str, sandbox_id: str) -> Mount:
    """The task's /workspace: the prepared volume (no copy-up of the image's /workspace). The labels mark a volume
    Swarm would make on a node without one as the sandbox's, so that its release removes that too."""
    labels = {LABEL_MANAGED: "true", LABEL_INSTANCE: instance, LABEL_ROLE: ROLE, LABEL_SANDBOX: sandbox_id}
    return Mount(WORKSPACE, volume_name(instance, sandbox_id), type="volume", no_copy=True, labels=labels,
                 driver_config=DriverConfig("local", {"type": "ext4", "device": MISSING_DEVICE}))


def mount_problems(mounts: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a stored service's workspace volume: without its driver options (an engine that drops
    them), a node with no prepared disk would give the task an unbounded volume of the engine's own."""
    for mount in mounts:
        if mount.get("Target") == WORKSPACE and mount.get("Type") == "volume":
            options = ((mount.get("VolumeOptions") or {}).get("DriverConfig") or {}).get("Options") or {}
            if options.get("device") != MISSING_DEVICE:
                return ["the workspace volume lacks the driver options that keep it off a node without its disk"]
    return []


class NodeDisks:
    """The sandboxes' workspace disks on every node whose engine the plane reaches (`engines`, by node id)."""

    def __init__(self, manager: Any, node_urls: Iterable[str], instance: str, image: str, disk_root: str,
                 size_mb: int) -> None:
        self._manager = manager
        self._urls = list(node_urls)
        self._instance = instance
        self._image = image
        self._root = disk_root
        self._size_mb = size_mb
        self.engines: dict[str, Any] = {}

    def start(self) -> None:
        """Learns which node each engine is; a node without one cannot hold a disk (left out of placement)."""
        self.engines[_node_id(self._manager)] = self._manager
        for url in self._urls:
            try:
                client = docker.DockerClient(base_url=url, version="auto", timeout=120)
                self.engines[_node_id(client)] = client
            except docker.errors.DockerException as exc:
                log.warning("node engine %s does not answer; no workspace disk is made there: %s", url, exc)
        self.engines.pop("", None)

    def close(self) -> None:
        for client in self.engines.values():
            if client is not self._manager:
                with contextlib.suppress(Exception):
                    client.close()
        self.engines.clear()

    def _own(self, role: str, sandbox_id: str = "") -> dict[str, str]:
        labels = {LABEL_MANAGED: "true", LABEL_INSTANCE: self._instance, LABEL_ROLE: role}
        if sandbox_id:
            labels[LABEL_SANDBOX] = sandbox_id
        return labels

    def _helper(self, node: str, *args: str) -> str:
        """Runs the helper script on `node` and returns its output. Removed however it ends: `run(remove=True)`
        leaves a container behind when its start fails."""
        client = self.engines[node]
        container = None
        try:
            container = client.containers.create(
                self._image, entrypoint=["sh", "-c", _HELPER, "helper"],
                command=[args[0], f"{self._instance}/{node}", *args[1:]],
                user="0:0", cap_drop=["ALL"], cap_add=["SYS_ADMIN"], device_cgroup_rules=LOOP_DEVICES,
                network_mode="none", labels=self._own(HELPER_ROLE), mem_limit=HELPER_MEMORY,
                volumes={"/dev": {"bind": "/dev", "mode": "rw"}, self._root: {"bind": "/disks", "mode": "rw"}},
            )
            container.start()
            status = int(container.wait(timeout=HELPER_TIMEOUT_S).get("StatusCode", -1))
            if status != 0:
                err = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()
                raise SandboxStartError(f"workspace disk on node {node}: {args[0]} failed ({status}): {err}")
            return str(container.logs(stdout=True, stderr=False).decode(errors="replace"))
        except docker.errors.DockerException as exc:
            raise SandboxStartError(f"workspace disk on node {node}: {args[0]} failed: {exc}") from exc
        except Exception as exc:  # the wait's timeout (the engine's HTTP client raises its own kinds)
            raise SandboxStartError(f"workspace disk on node {node}: {args[0]} failed: {exc}") from exc
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    client.api.remove_container(container.id, force=True)

    def prepare(self, sandbox_id: str, nodes: Iterable[str], labels: dict[str, str]) -> list[str]:
        """Makes the disk and its volume on each of `nodes`; returns those it could not (to exclude)."""
        failed = []
        for node in nodes:
            if node not in self.engines:
                failed.append(node)
                continue
            try:
                self._make(node, sandbox_id, labels)
            except (SandboxError, docker.errors.DockerException, IndexError) as exc:
                log.warning("sandbox %s: no workspace disk on node %s, left out of its placement: %s",
                            sandbox_id, node, exc)
                failed.append(node)
        return failed

    def _make(self, node: str, sandbox_id: str, labels: dict[str, str]) -> None:
        device = self._helper(node, "make", sandbox_id, str(self._size_mb)).strip().splitlines()[-1]
        try:
            self.engines[node].volumes.create(
                name=volume_name(self._instance, sandbox_id), driver="local",
                driver_opts={"type": "ext4", "device": device, "o": WORKSPACE_MOUNT_OPTIONS},
                labels={**labels, **self._own(ROLE, sandbox_id)},
            )
        except BaseException:
            self._helper(node, "release", sandbox_id)
            raise

    def probe(self, node: str, sandbox_id: str) -> str:
        """A sandbox's disk made and released on `node` for no sandbox (disk_auto: does the helper work there,
        with CAP_SYS_ADMIN and the loop devices?). Returns the error, "" when it works."""
        try:
            self._make(node, sandbox_id, {})
        except (SandboxError, docker.errors.DockerException, IndexError) as exc:
            return str(exc) or type(exc).__name__
        try:
            for volume in self._volumes(self.engines[node], sandbox_id):
                _remove_volume(volume)
            self._helper(node, "release", sandbox_id)
        except (SandboxError, docker.errors.DockerException) as exc:  # what is left goes at the next start
            log.warning("workspace disk probe on node %s not released: %s", node, exc)
        return ""

    def any_volume(self) -> bool:
        """Whether any node holds a workspace volume of this instance (a sandbox made while disks were on)."""
        filters = {"label": [f"{LABEL_INSTANCE}={self._instance}", f"{LABEL_ROLE}={ROLE}"]}
        return any(client.volumes.list(filters=filters) for client in self.engines.values())

    def holder(self, sandbox_id: str) -> str | None:
        """The node whose engine holds the sandbox's volume (after the others were released)."""
        for node, client in self.engines.items():
            if self._volumes(client, sandbox_id):
                return node
        return None

    def _volumes(self, client: Any, sandbox_id: str) -> list[Any]:
        filters = {"label": [f"{LABEL_INSTANCE}={self._instance}", f"{LABEL_SANDBOX}={sandbox_id}",
                             f"{LABEL_ROLE}={ROLE}"]}
        return list(client.volumes.list(filters=filters))

    def release(self, sandbox_id: str, except_node: str = "") -> None:
        """Removes the volume and releases the disk on every node (but `except_node`); idempotent."""
        for node, client in list(self.engines.items()):
            if node == except_node:
                continue
            try:
                volumes = self._volumes(client, sandbox_id)
                for volume in volumes:
                    _remove_volume(volume)
                if volumes or except_node:  # a disk is made with its volume; `except_node`: just prepared
                    self._helper(node, "release", sandbox_id)
            except (SandboxError, docker.errors.DockerException) as exc:
                log.warning("sandbox %s: workspace disk on node %s not released: %s", sandbox_id, node, exc)

    def volume_of(self, sandbox_id: str) -> tuple[Any, str, dict[str, str]]:
        """The kept workspace's node engine, volume name and labels (workspace_salvage reads it on that node through
        a never-started container)."""
        for client in self.engines.values():
            for volume in self._volumes(client, sandbox_id):
                return client, volume.name, volume.attrs.get("Labels") or {}
        raise SandboxError(f"sandbox {sandbox_id}'s workspace volume is on no node this plane reaches")

    def reconcile(self, keep: Iterable[str]) -> list[str]:
        """At start: volumes and disks of this instance's sandboxes not in `keep` (crashes' leftovers) go."""
        kept = sorted(set(keep))
        removed: list[str] = []
        for node, client in list(self.engines.items()):
            try:
                for helper in client.containers.list(all=True, filters={"label": [
                        f"{LABEL_INSTANCE}={self._instance}", f"{LABEL_ROLE}={HELPER_ROLE}"]}, ignore_removed=True):
                    helper.remove(force=True)  # a crash's: none runs before the plane serves
                for volume in client.volumes.list(filters={"label": [f"{LABEL_INSTANCE}={self._instance}",
                                                                     f"{LABEL_ROLE}={ROLE}"]}):
                    if (volume.attrs.get("Labels") or {}).get(LABEL_SANDBOX) not in kept:
                        _remove_volume(volume)
                        removed.append(volume.name)
                removed += [f"{node}/{i}" for i in self._helper(node, "keep", *kept).split()]
            except (SandboxError, docker.errors.DockerException) as exc:
                log.warning("workspace disks on node %s not reconciled: %s", node, exc)
        return removed


def _node_id(client: Any) -> str:
    return str((client.info().get("Swarm") or {}).get("NodeID", ""))


def _remove_volume(volume: Any) -> None:
    deadline = time.monotonic() + _VOLUME_REMOVE_S
    while True:  # in use until the task's container is gone on its node
        try:
            volume.remove(force=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
