"""A slow Docker engine's answers during a sandbox's removal: timeouts and 409s are waited out, never passed on raw.

The engine is scripted here (its answers in order) because a real one cannot be made to time out on demand;
tests/docker remove real containers through the same functions on every session's delete.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import docker.errors
import pytest
import requests
import requests.exceptions

from controlplane.errors import SandboxError
from controlplane.sandbox import container_removal


def _conflict() -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = 409
    return docker.errors.APIError("removal of container is already in progress", response=response)


def _server_error() -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = 500
    return docker.errors.APIError("driver failed", response=response)


class ScriptedEngine:
    """Answers each remove request with the next scripted exception (None: removed)."""

    def __init__(self, answers: list[Callable[[], BaseException] | None]) -> None:
        self.answers = answers
        self.calls = 0

    def _answer(self) -> None:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer()

    def remove_container(self, name: str, **_: Any) -> None:
        self._answer()

    def remove_volume(self, name: str, **_: Any) -> None:
        self._answer()


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(container_removal, "RETRY_PAUSE_S", 0.0)


async def test_a_timed_out_removal_is_asked_again_until_the_engine_is_done() -> None:
    engine = ScriptedEngine([lambda: requests.exceptions.ReadTimeout("read timed out"), _conflict, _conflict,
                             lambda: docker.errors.NotFound("gone")])
    await container_removal.remove_container(engine, "ocsb-x-1")  # type: ignore[arg-type]
    assert engine.calls == 4


async def test_a_removal_in_progress_is_not_taken_for_done() -> None:
    # Before: a 409 returned at once, and the volume's removal then met the container still holding it.
    engine = ScriptedEngine([_conflict, None])
    await container_removal.remove_container(engine, "ocsb-x-1")  # type: ignore[arg-type]
    assert engine.calls == 2


async def test_a_removal_past_its_patience_is_a_sandbox_error_naming_the_container() -> None:
    engine = ScriptedEngine([_conflict] * 1000)
    with pytest.raises(SandboxError, match=r"container ocsb-x-1 was not removed within 0 s \(the engine is still"):
        await container_removal.remove_container(engine, "ocsb-x-1", patience_s=0.0)  # type: ignore[arg-type]


async def test_other_engine_errors_are_not_retried() -> None:
    engine = ScriptedEngine([_server_error])
    with pytest.raises(docker.errors.APIError):
        await container_removal.remove_container(engine, "ocsb-x-1")  # type: ignore[arg-type]
    assert engine.calls == 1


async def test_a_volume_in_use_waits_for_its_container_to_go() -> None:
    engine = ScriptedEngine([_conflict, lambda: requests.exceptions.ConnectionError("reset"), None])
    await container_removal.remove_volume(engine, "ocsb-x-1-ws")  # type: ignore[arg-type]
    assert engine.calls == 3
    stuck = ScriptedEngine([_conflict] * 1000)
    with pytest.raises(SandboxError, match=r"volume ocsb-x-1-ws was not removed within 0 s \(it is still in use"):
        await container_removal.remove_volume(stuck, "ocsb-x-1-ws", patience_s=0.0)  # type: ignore[arg-type]


async def test_a_sandbox_removal_shares_one_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    # The container and the volume used to get the patience each, one after the other: a delete could take twice.
    monkeypatch.setattr(container_removal, "REMOVAL_PATIENCE_S", 0.5)

    class SlowEngine(ScriptedEngine):
        def remove_container(self, name: str, **_: Any) -> None:
            time.sleep(0.45)  # the container took nearly all of it

    engine = SlowEngine([_conflict] * 1000)
    with pytest.raises(SandboxError, match=r"volume v was not removed within 0 s"):
        await container_removal.remove_sandbox(engine, "c", "v")  # type: ignore[arg-type]
