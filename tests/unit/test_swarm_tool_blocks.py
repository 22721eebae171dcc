"""The Swarm sandbox's confinement as the fail-closed check sees it (the stored service spec), and the order
in which the managers' creation times decide who keeps a tool uid block."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.sessions.models import Resources
from controlplane.errors import HardeningError
from controlplane.sandbox import confinement
from controlplane.sandbox.layout import ENV_TOOL_UID, LABEL_TOOL_UID
from controlplane.sandbox.swarm.service import confinement_problems, verify_service_hardening
from controlplane.sandbox.swarm.tool_blocks import created_at
from controlplane.sandbox.tool_ids import ToolIds

UID = 200_008


def stored(env: dict[str, str], service_uid: str = str(UID), container_uid: str = str(UID)) -> dict[str, Any]:
    return {"Spec": {"Labels": {LABEL_TOOL_UID: service_uid}, "TaskTemplate": {"ContainerSpec": {
        "Env": [f"{k}={v}" for k, v in env.items()], "Labels": {LABEL_TOOL_UID: container_uid},
    }}}}


def owns(uid: int) -> bool:
    return ToolIds(200_000, 65_536).owns(uid)


def test_a_service_with_its_own_block_and_the_filter_passes() -> None:
    assert confinement_problems(stored(confinement.agent_env(UID)), UID, owns) == []


@pytest.mark.parametrize(("service", "why"), [
    (stored({ENV_TOOL_UID: str(UID)}), "the agent's syscall filter is not asked for"),
    (stored(confinement.agent_env(UID) | {"AGENT_SYSCALL_DENY": "io_setup"}), "syscall filter is not asked for"),
    (stored({k: v for k, v in confinement.agent_env(UID).items() if k != ENV_TOOL_UID}), "not the sandbox's own"),
    (stored(confinement.agent_env(1000)), "not the sandbox's own block (1000)"),
    (stored(confinement.agent_env(UID), service_uid="200016"), "not the sandbox's own block"),
    (stored(confinement.agent_env(UID), container_uid=""), "not the sandbox's own block"),
])
def test_a_service_without_its_block_or_filter_fails_closed(service: dict[str, Any], why: str) -> None:
    assert any(why in p for p in confinement_problems(service, UID, owns))
    full = {"Spec": {**service["Spec"], "TaskTemplate": {**service["Spec"]["TaskTemplate"], "ContainerSpec": {
        **service["Spec"]["TaskTemplate"]["ContainerSpec"], "CapabilityDrop": ["ALL"], "ReadOnly": True}}}}
    with pytest.raises(HardeningError, match=why.replace("(", r"\(").replace(")", r"\)")):
        verify_service_hardening(full, Resources(1.0, 256, 64), "net", UID, owns)


def test_a_uid_outside_the_reserved_range_is_refused_even_when_asked_for() -> None:
    assert confinement_problems(stored(confinement.agent_env(1000), "1000", "1000"), 1000, owns) != []


def test_creation_times_order_by_value_not_by_text() -> None:
    earlier = {"CreatedAt": "2026-11-27T19:10:00.12Z"}
    later = {"CreatedAt": "2026-11-27T19:10:00.1234567Z"}
    latest = {"CreatedAt": "2026-11-27T19:10:00.9Z"}
    assert created_at(earlier) < created_at(later) < created_at(latest)
    assert created_at({"CreatedAt": "2026-11-27T19:10:01Z"}) > created_at(latest)
