"""The control plane's held `tool.log` events: per session, bounded in bytes, per tenant, forgotten at the end;
and how `controlplane logs` shows a line (control characters escaped)."""

from __future__ import annotations

import asyncio

from controlplane.cli_logs import line_text
from controlplane.core.sessions.events import EventBus
from controlplane.core.sessions.recent_logs import RecentLogs


def _log(bus: EventBus, tenant: str, session: str, text: str) -> None:
    bus.publish("tool.log", tenant, session, callID="c", origin="/workspace/t.ts", level="info", text=text, time=1.0)


async def _settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_held_per_session_and_tenant_then_forgotten() -> None:
    bus = EventBus()
    logs = RecentLogs(bus)
    _log(bus, "a", "s1", "one")
    _log(bus, "a", "s2", "two")
    _log(bus, "b", "s3", "other tenant")
    bus.publish("tool.state", "a", "s1", callID="c", status="running")
    await _settled()
    assert [e.properties["text"] for e in logs.recent("a", "s1")] == ["one"]
    assert [e.properties["text"] for e in logs.recent("a")] == ["one", "two"]
    assert logs.recent("b", "s1") == []
    bus.publish("session.deleted", "a", "s1")
    await _settled()
    assert logs.recent("a", "s1") == []
    assert logs.sessions() == 2


async def test_a_session_printing_in_a_loop_keeps_only_its_latest_lines() -> None:
    bus = EventBus()
    logs = RecentLogs(bus, max_bytes=10_000)
    for i in range(2000):
        _log(bus, "a", "s", f"line {i} " + "x" * 100)
    await _settled()
    held = logs.recent("a", "s")
    assert held[0].properties["text"].endswith("older log lines dropped]")
    assert held[-1].properties["text"].startswith("line 1999 ")
    assert sum(len(str(v)) for e in held[1:] for v in e.properties.values()) <= 10_000
    dropped = int(held[0].properties["text"].split()[0][1:])
    assert dropped + len(held) - 1 == 2000


def test_a_line_cannot_drive_the_readers_terminal() -> None:
    text = line_text({"time": 0, "level": "warn", "origin": "/w/a.ts", "callID": "c1",
                      "text": "ok\x1b]0;owned\x07\x1b[2J\r\nnext\tcol é"})
    assert "\x1b" not in text
    assert "\r" not in text
    assert "\n" not in text
    assert text.endswith("[c1] ok\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0anext\tcol é")
