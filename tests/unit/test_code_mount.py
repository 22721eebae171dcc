"""The code snapshot's own mount (controlplane.sandbox.code_mount): asked for and checked, fail-closed."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.sessions.models import Resources
from controlplane.errors import HardeningError
from controlplane.sandbox import code_mount
from controlplane.sandbox.docker import verify_hardening
from controlplane.sandbox.swarm.service import verify_service_hardening


def hardened(tmpfs: dict[str, str]) -> dict[str, Any]:
    return {"HostConfig": {
        "NetworkMode": "none", "CapDrop": ["ALL"], "CapAdd": ["SETUID"], "SecurityOpt": ["no-new-privileges"],
        "ReadonlyRootfs": True, "PidsLimit": 64, "Memory": 256 << 20, "NanoCpus": 1_000_000_000, "Tmpfs": tmpfs,
    }}


def test_the_container_option_is_root_only_and_sized_from_memory() -> None:
    assert code_mount.docker_tmpfs(1024) == {"/run/code": "rw,nosuid,nodev,size=128m,mode=755"}
    assert code_mount.code_mb(64) == 16
    assert code_mount.code_mb(8192) == 256
    verify_hardening(hardened({"/tmp": "rw,mode=1777", **code_mount.docker_tmpfs(256)}), Resources(1.0, 256, 64), None)


@pytest.mark.parametrize(("tmpfs", "why"), [
    ({"/tmp": "rw,mode=1777"}, "the code snapshot dir /run/code is not a tmpfs of its own"),
    ({"/run/code": "rw,size=64m"}, "the code snapshot dir /run/code has options 'rw,size=64m', wanted mode=755"),
    ({"/run/code": "rw,size=64m,mode=1777"}, "has options 'rw,size=64m,mode=1777', wanted mode=755"),
])
def test_a_container_without_the_private_code_mount_fails_hardening(tmpfs: dict[str, str], why: str) -> None:
    with pytest.raises(HardeningError, match=why):
        verify_hardening(hardened(tmpfs), Resources(1.0, 256, 64), None)


def service(mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Spec": {"TaskTemplate": {
        "ContainerSpec": {"CapabilityDrop": ["ALL"], "CapabilityAdd": ["SETUID"], "ReadOnly": True,
                          "Command": ["python3", "-c"], "Mounts": mounts},
        "Resources": {"Limits": {"Pids": 64, "MemoryBytes": 256 << 20, "NanoCPUs": 1_000_000_000}},
        "RestartPolicy": {"Condition": "none"}, "Networks": [{"Target": "net"}],
    }}}


@pytest.mark.parametrize(("mounts", "refused"), [
    ([{"Target": "/run/code", "Type": "tmpfs", "TmpfsOptions": {"Mode": 0o755}}], False),
    ([{"Target": "/run/code", "Type": "tmpfs", "TmpfsOptions": {}}], True),
    ([{"Target": "/run/code", "Type": "tmpfs", "TmpfsOptions": {"Mode": 0o1777}}], True),
    ([{"Target": "/run/code", "Type": "volume"}], True),
    ([{"Target": "/tmp", "Type": "tmpfs", "TmpfsOptions": {"Mode": 0o1777}}], True),
])
def test_a_service_without_the_private_code_mount_fails_hardening(mounts: list[dict[str, Any]], refused: bool) -> None:
    problems = code_mount.service_problems(mounts)
    assert bool(problems) is refused
    with pytest.raises(HardeningError) as info:
        verify_service_hardening(service(mounts), Resources(1.0, 256, 64), "net", 200000, lambda uid: True)
    # The command check fails in this fixture on purpose (its own message): only the code mount's is looked at.
    assert ("the code snapshot dir /run/code" in str(info.value)) is refused
