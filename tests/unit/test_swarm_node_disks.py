"""The stored Swarm service's workspace volume must keep the driver options that make a node without its prepared
disk fail the task (node_disks), or the task would get an unbounded volume of that node's engine."""

from __future__ import annotations

from typing import Any

from controlplane.sandbox.swarm.node_disks import mount_problems, service_mount


def _stored(mount: Any) -> dict[str, Any]:
    """As the engine returns it: the Mount's fields (docker-py builds them with the API's names)."""
    return dict(mount)


def test_the_service_mount_carries_its_guard() -> None:
    mount = _stored(service_mount("inst", "0123456789ab"))
    assert mount["Source"] == "ocsb-inst-0123456789ab-ws"
    assert mount["VolumeOptions"]["NoCopy"] is True
    assert mount_problems([mount]) == []


def test_a_workspace_volume_stored_without_its_driver_options_is_refused() -> None:
    dropped = {k: v for k, v in _stored(service_mount("inst", "0123456789ab")).items() if k != "VolumeOptions"}
    assert mount_problems([dropped]) != []
    other = _stored(service_mount("inst", "0123456789ab"))
    other["VolumeOptions"]["DriverConfig"]["Options"] = {"type": "ext4", "device": "/dev/sda1"}
    assert "keep it off a node without its disk" in mount_problems([other])[0]


def test_a_tmpfs_workspace_has_nothing_to_guard() -> None:
    assert mount_problems([{"Target": "/workspace", "Type": "tmpfs"}]) == []
