"""When a running session's lifetime is over (controlplane.core.sessions.expiry), and that every expiry's message
says so in the words the retention of ending sessions tells an expiry by."""

from __future__ import annotations

from controlplane.core.sessions.admission import SessionPolicy
from controlplane.core.sessions.expiry import EXPIRED, reason
from controlplane.core.sessions.models import Resources, Session, SessionState

POLICY = SessionPolicy(defaults=Resources(1, 256, 64), maximum=Resources(2, 512, 128), idle_timeout_s=10,
                       max_lifetime_s=100, reap_interval_s=1, max_archive_bytes=1 << 20)


def _session(created: float, active: float) -> Session:
    return Session("ses_a", "t", "build", SessionState.READY, POLICY.defaults, created, active)


def test_idle_and_maximum_lifetimes() -> None:
    assert reason(_session(0, 5), POLICY, 14.9) is None
    assert reason(_session(0, 5), POLICY, 15) == f"{EXPIRED}idle for 10 s"
    assert reason(_session(0, 99), POLICY, 100) == f"{EXPIRED}reached the maximum lifetime of 100 s"
    assert reason(_session(0, 99), POLICY, 99.5) is None
