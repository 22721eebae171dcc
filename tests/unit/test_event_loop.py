"""The loop our server processes run on: uvloop's by default, asyncio's on request or without uvloop."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from sandbox_agent import event_loop


def test_uvloop_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.LOOP_VAR, raising=False)
    assert event_loop.loop_factory() is uvloop.new_event_loop


def test_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.LOOP_VAR, "asyncio")
    assert event_loop.loop_factory() is None

    async def kind() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    assert not issubclass(event_loop.run(kind()), uvloop.Loop)


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.LOOP_VAR, "trio")
    with pytest.raises(ValueError, match="OCSB_EVENT_LOOP must be 'uvloop' or 'asyncio', not 'trio'"):
        event_loop.loop_factory()


def test_run_returns_the_coroutines_value_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.LOOP_VAR, raising=False)

    async def kind() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    assert issubclass(event_loop.run(kind()), uvloop.Loop)


async def test_the_tests_run_on_the_servers_loop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
